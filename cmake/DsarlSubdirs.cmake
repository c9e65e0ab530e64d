# dsarl_add_subdirectories_if_present(<dir>...): adds each listed subdirectory that has a CMakeLists.txt.
function(dsarl_add_subdirectories_if_present)
  foreach(dir ${ARGN})
    if(EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/${dir}/CMakeLists.txt")
      add_subdirectory(${dir})
    endif()
  endforeach()
endfunction()

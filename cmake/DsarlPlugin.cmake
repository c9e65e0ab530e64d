# dsarl_add_plugin(<stem> ENTRY <file.c> SOURCES ... [LIBS ...] [INCLUDES ...])
#
# Builds dsarl-<stem>.so into lib/dsarl/plugins/ of the build and install trees. Plugins link libdsarl (one shared
# core: one registry, one logger), export only their descriptor (-fvisibility=hidden) and must resolve every
# symbol at link time (--no-undefined), so a missing dependency fails the build, not the first call.
#
# SOURCES (everything but the descriptor) also form the object library dsarl-<stem>-objects, which tests link
# directly to call a plugin's functions without dlopen; ENTRY holds DSARL_PLUGIN_DEFINE and the init function,
# so several plugins' objects can link into one test without duplicate descriptors.
function(dsarl_add_plugin stem)
  cmake_parse_arguments(P "" "ENTRY" "SOURCES;LIBS;INCLUDES" ${ARGN})
  set(target dsarl-${stem})
  add_library(${target}-objects OBJECT ${P_SOURCES})
  target_link_libraries(${target}-objects PUBLIC dsarl ${P_LIBS})
  target_include_directories(${target}-objects PUBLIC ${CMAKE_CURRENT_SOURCE_DIR} ${P_INCLUDES})
  add_library(${target} MODULE ${P_ENTRY})
  set_target_properties(${target} PROPERTIES PREFIX "" OUTPUT_NAME "dsarl-${stem}"
                        LIBRARY_OUTPUT_DIRECTORY "${DSARL_PLUGIN_OUTPUT_DIRECTORY}"
                        INSTALL_RPATH "$ORIGIN/../.." BUILD_RPATH "$ORIGIN/../..")
  target_link_libraries(${target} PRIVATE ${target}-objects dsarl ${P_LIBS})
  target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  install(TARGETS ${target} LIBRARY DESTINATION "${DSARL_PLUGIN_SUBDIR}")
  set_property(GLOBAL APPEND PROPERTY DSARL_PLUGIN_TARGETS ${target})
endfunction()

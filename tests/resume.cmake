# Crash safety: a GRPO run killed with SIGKILL resumes bit-identically (shell-driven, needs python3 for the
# metrics comparison).
add_test(NAME grpo_sigkill_resume COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/grpo_sigkill_check.sh ${CMAKE_BINARY_DIR}
         ${PROJECT_SOURCE_DIR})
set_tests_properties(grpo_sigkill_resume PROPERTIES LABELS unit TIMEOUT 300 SKIP_RETURN_CODE 77)

# tests/support/cli_steps.cmake — steps of the command-line walkthrough tests (cmake -P scripts):
#   run_step(RC cmd args...)  runs the command, prints it with its output, fails unless its exit
#                             status is RC; its stdout becomes LAST_OUTPUT
#   expect_match(REGEX)       fails unless LAST_OUTPUT matches REGEX
function(run_step expect_rc)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "$ ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL expect_rc)
    message(FATAL_ERROR "expected exit status ${expect_rc}, got ${rc}")
  endif()
  set(LAST_OUTPUT "${out}" PARENT_SCOPE)
endfunction()
function(expect_match regex)
  if(NOT LAST_OUTPUT MATCHES "${regex}")
    message(FATAL_ERROR "output does not match '${regex}'")
  endif()
endfunction()

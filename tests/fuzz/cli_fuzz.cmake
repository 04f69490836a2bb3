# tests/fuzz/cli_fuzz.cmake — one walkthrough of `oasis-verify fuzz --cmd` (docs/fuzz-protocol.md)
# with the example program tests/fuzz/cmd_consumer.py and its injected bugs:
#   CASE=wrong  BUG=nosink|nan_masked  exit 1, a wrong answer; the printed replay command fails
#                                      (exit 1) through `oasis-verify compare`
#   CASE=hang                          exit 1, HANG within the 2 s --timeout (the test's own TIMEOUT
#                                      bounds the wall time)
#   CASE=crash                         exit 1, CRASH with exit status 3 and the program's stderr
# Invoked as cmake -DVERIFY=.. -DPYTHON=.. -DCONSUMER=.. -DWORK=.. -DCASE=.. [-DBUG=..] [-DARGS=..]
#   -P cli_fuzz.cmake  (ARGS: extra fuzz arguments, a ;-list)
include(${CMAKE_CURRENT_LIST_DIR}/../support/cli_steps.cmake)

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(_program "'${PYTHON}' '${CONSUMER}' {in} {out}")
set(_common --without window,key_lengths,bias,mask --replay ${WORK}/replay --json ${WORK}/report.json --quiet)

if(CASE STREQUAL "wrong")
  run_step(1 ${VERIFY} fuzz attention --cmd "${_program} --bug ${BUG}" ${_common} ${ARGS})
  expect_match("FIRST FAILURE \\(wrong\\)")
  expect_match("shrunk to ")
  expect_match("verdict: FAIL")
  expect_match("\nfuzz: FAIL")
  if(NOT LAST_OUTPUT MATCHES "replay: oasis-verify compare ([^\n]+)\n")
    message(FATAL_ERROR "the report prints no replay command")
  endif()
  set(_config "${CMAKE_MATCH_1}")
  if(NOT EXISTS "${_config}")
    message(FATAL_ERROR "the replay command names '${_config}', which does not exist")
  endif()
  # The replay needs neither the program nor the fuzzer: compare alone gives the same verdict.
  run_step(1 ${VERIFY} compare "${_config}")
  expect_match("verdict: FAIL")
elseif(CASE STREQUAL "hang")
  run_step(1 ${VERIFY} fuzz attention --cmd "${_program} --bug hang" ${_common} --only typical --timeout 2
           --max-shrink 2)
  expect_match("  typical +f32 +HANG")
  expect_match("FIRST FAILURE \\(hang\\)")
  expect_match("ran past the 2 s limit and was killed")
elseif(CASE STREQUAL "crash")
  run_step(1 ${VERIFY} fuzz attention --cmd "${_program} --bug exit3" ${_common} --only typical --max-shrink 3)
  expect_match("  typical +f32 +CRASH")
  expect_match("FIRST FAILURE \\(crash\\)")
  expect_match("exit status 3")
  expect_match("failing on purpose")
else()
  message(FATAL_ERROR "unknown CASE '${CASE}'")
endif()
if(NOT EXISTS ${WORK}/report.json)
  message(FATAL_ERROR "--json did not write the report")
endif()

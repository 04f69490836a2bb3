# tests/fuzz/cli_tests.cmake — the --cmd kernel and `oasis-verify fuzz` (docs/fuzz-protocol.md),
# included by tests/fuzz/CMakeLists.txt.
#   fuzz_command_kernel_tests  fuzz::command_kernel with shell programs (folders, names, dtypes,
#                              options.json, exit statuses, signals, the timeout, cleanup)
#   fuzz_cli.*                 the CLI with the NumPy example tests/fuzz/cmd_consumer.py: clean for
#                              attention, its injected bugs as wrong / hang / crash, usage errors
if(NOT TARGET oasis-verify)
  return()
endif()

oasis_add_gtest(NAME fuzz_command_kernel_tests SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_command_kernel.cpp LABELS unit
                LIBS oasis_verify TIMEOUT 120)

set(_fuzz_v $<TARGET_FILE:oasis-verify>)
# Usage and input errors: exit status 2 before any program runs.
set(_fuzz_usage
    "unknown_op|fuzz nope --cmd 'true {in} {out}'"
    "unknown_feature|fuzz attention --cmd 'true {in} {out}' --without warp_drive"
    "unknown_regime|fuzz attention --cmd 'true {in} {out}' --only no_such_regime"
    "missing_cmd|fuzz attention"
    "cmd_without_in|fuzz attention --cmd 'true {out}'"
    "cmd_without_out|fuzz attention --cmd 'true {in}'"
    "bad_dtype|fuzz attention --cmd 'true {in} {out}' --dtypes f32,i32"
    "bad_fixed|fuzz attention --cmd 'true {in} {out}' --fixed causal=maybe"
    "nothing_to_run|fuzz attention --cmd 'true {in} {out}' --without causal,noncausal --quiet")
set(_fuzz_tests)
foreach(_u ${_fuzz_usage})
  string(REPLACE "|" ";" _u "${_u}")
  list(GET _u 0 _name)
  list(GET _u 1 _args)
  add_test(NAME fuzz_cli.usage_${_name} COMMAND sh -c "\"$0\" ${_args}; test $? -eq 2" ${_fuzz_v})
  list(APPEND _fuzz_tests fuzz_cli.usage_${_name})
endforeach()
add_test(NAME fuzz_cli.help COMMAND ${_fuzz_v} help fuzz)
add_test(NAME fuzz_cli.list COMMAND sh -c "\"$0\" fuzz attention --list | grep -q '^sink_infinite '" ${_fuzz_v})
list(APPEND _fuzz_tests fuzz_cli.help fuzz_cli.list)

# The walkthroughs need an interpreter with NumPy: Debian's /usr/bin/python3 with python3-numpy
# (the interpreter found for the Python module otherwise).
set(_fuzz_py /usr/bin/python3)
if(NOT EXISTS ${_fuzz_py})
  set(_fuzz_py ${Python3_EXECUTABLE})
endif()
set(_fuzz_numpy 1)
if(_fuzz_py)
  execute_process(COMMAND ${_fuzz_py} -c "import numpy" RESULT_VARIABLE _fuzz_numpy OUTPUT_QUIET ERROR_QUIET)
endif()
if(_fuzz_numpy EQUAL 0)
  set(_consumer ${CMAKE_CURRENT_LIST_DIR}/cmd_consumer.py)
  set(_prog "'${_fuzz_py}' '${_consumer}' {in} {out}")
  set(_without window,key_lengths,bias,mask)
  # (a) the correct program fuzzes clean: every attention regime it can take in f32, and the regimes
  # with infinite and huge sinks, empty rows and grouped heads in the other dtypes.
  add_test(NAME fuzz_cli.clean_attention_f32
           COMMAND ${_fuzz_v} fuzz attention --cmd "${_prog}" --without ${_without} --quiet)
  add_test(NAME fuzz_cli.clean_attention_16bit_f64
           COMMAND ${_fuzz_v} fuzz attention --cmd "${_prog}" --without ${_without} --quiet --dtypes bf16,f16,f64
                   --only typical,sink_infinite,huge_sink,empty_rows_causal,gqa,lse_underflow)
  list(APPEND _fuzz_tests fuzz_cli.clean_attention_f32 fuzz_cli.clean_attention_16bit_f64)
  # (b)-(d) the injected bugs, each in a cmake -P walkthrough (cli_fuzz.cmake).
  set(_walk ${CMAKE_COMMAND} -DVERIFY=${_fuzz_v} -DPYTHON=${_fuzz_py} -DCONSUMER=${_consumer})
  set(_script -P ${CMAKE_CURRENT_LIST_DIR}/cli_fuzz.cmake)
  set(_work ${CMAKE_CURRENT_BINARY_DIR}/cli_fuzz)
  add_test(NAME fuzz_cli.wrong_nosink
           COMMAND ${_walk} -DWORK=${_work}/nosink -DCASE=wrong -DBUG=nosink "-DARGS=--max-shrink;40" ${_script})
  add_test(NAME fuzz_cli.wrong_nan_masked
           COMMAND ${_walk} -DWORK=${_work}/nan_masked -DCASE=wrong -DBUG=nan_masked
                   "-DARGS=--only;typical,empty_rows_causal;--max-shrink;40" ${_script})
  add_test(NAME fuzz_cli.hang COMMAND ${_walk} -DWORK=${_work}/hang -DCASE=hang ${_script})
  add_test(NAME fuzz_cli.crash COMMAND ${_walk} -DWORK=${_work}/crash -DCASE=crash ${_script})
  list(APPEND _fuzz_tests fuzz_cli.wrong_nosink fuzz_cli.wrong_nan_masked fuzz_cli.crash)
  # A hang costs the 2 s timeout on the run and on each of its 2 shrinking calls: about 6 s.
  set_tests_properties(fuzz_cli.hang PROPERTIES LABELS unit TIMEOUT 30)
else()
  message(STATUS "oasis: the fuzz --cmd walkthroughs are skipped (no python3 with numpy; Debian: python3-numpy)")
endif()
set_tests_properties(${_fuzz_tests} PROPERTIES LABELS unit TIMEOUT 120)

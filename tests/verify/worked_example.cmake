# tests/verify/worked_example.cmake — runs exactly the walkthrough of docs/verify.md:
#   producer DIR;                 oasis-verify compare DIR/attention.json -> exit 0
#                                 oasis-verify compare DIR/psi.json       -> exit 0
#   producer DIR --mistake lse;   compare attention.json -> exit 1, lse and p_null FAIL, out PASS,
#                                 the first mismatch named lse[0, 0, 0]
#   producer DIR --mistake psi-sum; compare psi.json -> exit 1, psi FAIL at psi[0, 0]
#   producer DIR (good);          compare attention_backward.json -> exit 0
#   producer DIR --mistake grad-d; compare attention_backward.json -> exit 1, grad_v PASS,
#                                 grad_q, grad_k, grad_null_logits FAIL
# Invoked as cmake -DPRODUCER=.. -DVERIFY=.. -DWORK=.. -P worked_example.cmake
include(${CMAKE_CURRENT_LIST_DIR}/../support/cli_steps.cmake)

file(REMOVE_RECURSE ${WORK})
foreach(d good lse psi grad)
  file(MAKE_DIRECTORY ${WORK}/${d})
endforeach()

run_step(0 ${PRODUCER} ${WORK}/good)
run_step(0 ${VERIFY} compare ${WORK}/good/attention.json)
expect_match("verdict: PASS")
run_step(0 ${VERIFY} compare ${WORK}/good/psi.json)
run_step(0 ${VERIFY} compare ${WORK}/good/attention_backward.json)
expect_match("verdict: PASS \\(4 of 4")

run_step(0 ${PRODUCER} ${WORK}/lse --mistake lse)
run_step(1 ${VERIFY} compare ${WORK}/lse/attention.json --json ${WORK}/lse/report.json)
expect_match("\n  out +f32 [^\n]* PASS")
expect_match("\n  lse +f32 [^\n]* FAIL")
expect_match("\n  p_null +f32 [^\n]* FAIL")
expect_match("lse\\[0, 0, 0\\]: got")
expect_match("verdict: FAIL")
if(NOT EXISTS ${WORK}/lse/report.json)
  message(FATAL_ERROR "--json did not write the report")
endif()

run_step(0 ${PRODUCER} ${WORK}/psi --mistake psi-sum)
run_step(1 ${VERIFY} compare ${WORK}/psi/psi.json)
expect_match("psi\\[0, 0\\]: got")

run_step(0 ${PRODUCER} ${WORK}/grad --mistake grad-d)
run_step(1 ${VERIFY} compare ${WORK}/grad/attention_backward.json)
expect_match("\n  grad_v +f32 [^\n]* PASS")
expect_match("\n  grad_q +f32 [^\n]* FAIL")
expect_match("\n  grad_k +f32 [^\n]* FAIL")
expect_match("\n  grad_null_logits +f32 [^\n]* FAIL")
expect_match("verdict: FAIL(-certain)? \\(1 of 4")

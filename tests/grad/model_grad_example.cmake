# tests/grad/model_grad_example.cmake — runs exactly the model-gradient walkthrough of docs/verify-model.md:
#   producer DIR;                          oasis-verify compare DIR/model_grad.json -> exit 0, 31 of 31 PASS
#   producer DIR --mistake theta-buffer;   compare -> exit 1, the two non-zero theta gradients FAIL, 29 PASS
#   producer DIR --mistake loss-scale;     compare -> exit 1, max rel 0.8333 (= 1 - 1/N, N = 6 tokens)
# Invoked as cmake -DPRODUCER=.. -DVERIFY=.. -DWORK=.. -P model_grad_example.cmake
include(${CMAKE_CURRENT_LIST_DIR}/../support/cli_steps.cmake)

file(REMOVE_RECURSE ${WORK})
foreach(d good theta scale)
  file(MAKE_DIRECTORY ${WORK}/${d})
endforeach()

run_step(0 ${PRODUCER} ${WORK}/good)
run_step(0 ${VERIFY} compare ${WORK}/good/model_grad.json)
expect_match("\n  grad.layers.1.mlp_res.theta f32 [^\n]* PASS")
expect_match("verdict: PASS \\(31 of 31")

run_step(0 ${PRODUCER} ${WORK}/theta --mistake theta-buffer)
run_step(1 ${VERIFY} compare ${WORK}/theta/model_grad.json)
expect_match("\n  grad.final_res.theta f32 [^\n]* FAIL")
expect_match("\n  grad.layers.1.mlp_res.theta f32 [^\n]* FAIL")
expect_match("\n  grad.layers.0.attn_res.theta f32 [^\n]* PASS")
expect_match("got 0, oracle -0.239")
expect_match("verdict: FAIL \\(29 of 31")

run_step(0 ${PRODUCER} ${WORK}/scale --mistake loss-scale)
run_step(1 ${VERIFY} compare ${WORK}/scale/model_grad.json)
expect_match("\n  grad.norm.weight f32 [^\n]* 0.8333 [^\n]* FAIL")
expect_match("verdict: FAIL")

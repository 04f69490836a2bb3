// verify/compare_model.cpp — `compare` at the model level (op "model"; docs/verify.md).
//
// The weights and the configuration come from a file written by oasis::model::save_model
// (oasis/model/io.hpp); the oracle runs Model<mp50>::forward on the given token ids, and bounds
// the forward error of the plain same-precision model with the model's own first-order error
// propagation (ForwardOptions::error_u = u_D, ForwardResult::logit_error: per token, a bound on
// max_v |logit error|). Policy per logit: |x - ref| <= 0.5 ulp_D(ref) + 2 logit_error[token](u_D).
#include <cmath>

#include "compare_detail.hpp"
#include "oasis/io/safetensors.hpp"

#if __has_include("oasis/model/io.hpp")
#include "oasis/model/io.hpp"
#define OASIS_VERIFY_HAVE_MODEL 1
#endif

namespace oasis::verify::detail {

CompareReport op_model(const io::json::Value& model, const std::string& base_dir, const io::TensorMap& inputs,
                       const io::TensorMap& outputs, const CompareOptions& opt) {
  OASIS_REQUIRE(model.is_string(), "model", "must be the path of a weights file (.safetensors)");
  const std::string path = (model.text.empty() || model.text[0] == '/') ? model.text : base_dir + "/" + model.text;
#if defined(OASIS_VERIFY_HAVE_MODEL)
  const oasis::model::Model<mp50> m = oasis::model::load_model<mp50>(path);
  auto it = inputs.find("ids");
  OASIS_REQUIRE(it != inputs.end(), "inputs", "op model needs input tensor 'ids' [B, T] (token ids)");
  const Tensor<double>& idt = it->second.values;
  require_rank(idt, 2, "ids", "[B, T]");
  std::vector<index_t> ids(static_cast<std::size_t>(idt.size()));
  for (index_t i = 0; i < idt.size(); ++i) {
    const double x = idt[i];
    OASIS_REQUIRE(std::isfinite(x) && x == std::floor(x) && x >= 0 && x < 9.0e15, "ids", "entry ", i, " = ", x,
                  " is not a non-negative integer");
    ids[static_cast<std::size_t>(i)] = static_cast<index_t>(x);
  }
  const index_t B = idt.dim(0), Tn = idt.dim(1);
  CompareReport rep;
  rep.op = "model";
  for (const auto& [name, t] : outputs) {
    if (name != "logits") {
      rep.notes.push_back("output '" + name + "' is not an output of op model (outputs: logits); ignored");
      continue;
    }
    oasis::model::ForwardOptions fo;
    fo.error_u = io::dtype_eps(t.dtype) / 2;  // bound the plain model run in the output's precision
    const oasis::model::ForwardResult<mp50> ref = m.forward(ids, B, Tn, fo);
    Tensor<double> plain(ref.logits.shape());
    const index_t V = ref.logits.dim(2);
    for (index_t r = 0; r < B * Tn; ++r)
      for (index_t v = 0; v < V; ++v) plain[r * V + v] = ref.logit_error.at(static_cast<std::size_t>(r));
    rep.tensors.push_back(compare_tensor(name, t, ref.logits, plain, opt.show));
  }
  OASIS_REQUIRE(!rep.tensors.empty(), "outputs", "op model compares 'logits' [B, T, vocab], which is not in the outputs");
  rep.passed = rep.tensors.front().passed;
  return rep;
#else
  (void)inputs; (void)outputs; (void)opt;
  throw invalid_argument("op", "op model needs oasis/model/io.hpp, which this build does not have (" + path + ")");
#endif
}

}  // namespace oasis::verify::detail

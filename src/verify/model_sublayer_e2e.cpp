// src/verify/model_sublayer_e2e.cpp — the end-to-end rows of the sublayer outputs of a minimal trace
// (model_row_parity.hpp). A trace holding `<S>.output` without `<S>.input` checks that output on the
// input its router forms from earlier outputs: a bound composing a router and a sublayer, loose
// enough that a wiring mistake moving the outputs by units can pass it. The row rule against a
// replay of the whole model is as tight as the logits' end-to-end verdict, and the first sublayer
// output it fails names where the mistake enters.
#include <algorithm>
#include <cmath>

#include "model_checker.hpp"
#include "model_row_parity.hpp"
#include "oasis/model/io.hpp"

namespace oasis::verify::detail {
namespace {

namespace om = oasis::model;

double store_bf16(double x) { return io::round_to_dtype(x, DType::bf16); }
double store_f16(double x) { return io::round_to_dtype(x, DType::f16); }

/// `<S>.output` of a forward with its trace, as doubles (T: the forward's scalar).
template <class T, class Out>
Tensor<Out> traced_output(const om::ForwardResult<T>& r, const std::string& sublayer) {
  for (const auto& tr : r.trace)
    if (tr.name == sublayer) return tr.output.template cast<Out>();
  throw invalid_argument(sublayer, "the configured model has no sublayer output here");
}

std::string sublayer_of(const std::string& name) { return name.substr(0, name.rfind('.')); }

}  // namespace

std::vector<TensorReport> sublayer_end_to_end(const om::Model<double>& d, const std::function<const om::Model<mp50>&()>& mp,
                                              const TensorMap& outputs, const std::vector<std::string>& names,
                                              const std::vector<index_t>& ids, index_t B, index_t Tn,
                                              const CompareOptions& opt, std::string& note) {
  std::vector<TensorReport> out;
  if (names.empty()) return out;
  const index_t w = d.config().d_model;
  om::ForwardOptions ft;
  ft.trace = true;
  // the replays every row may need, built once: double and long double (the estimate), mp50 (exact)
  std::unique_ptr<om::ForwardResult<double>> xd;
  std::unique_ptr<om::ForwardResult<long double>> xld;
  std::unique_ptr<om::ForwardResult<mp50>> xhp;
  auto hp = [&]() -> const om::ForwardResult<mp50>& {
    if (!xhp) xhp = std::make_unique<om::ForwardResult<mp50>>(mp().forward(ids, B, Tn, ft));
    return *xhp;
  };
  std::map<DType, std::pair<TensorMap, std::unique_ptr<ModelCheckerOf<double>>>> refs;  // x_ref's trace per dtype
  index_t estimated = 0, exact = 0;
  for (const std::string& name : names) {
    const StoredTensor& got = outputs.at(name);
    const DType D = got.dtype;
    const bool wide = D == DType::f64;
    if (!refs.count(D)) {  // the plain replay in the trace's precision: x_ref, and the inputs of e_last's step
      om::ForwardOptions fo = ft;
      fo.store = D == DType::bf16 ? store_bf16 : D == DType::f16 ? store_f16 : nullptr;
      auto& slot = refs[D];  // the checker holds a reference to the map it reads: build it in place
      slot.first = wide ? om::trace_tensors(d.forward(ids, B, Tn, fo), D)
                        : om::trace_tensors(d.cast<float>().forward(ids, B, Tn, fo), D);
      slot.second = std::make_unique<ModelCheckerOf<double>>(d, slot.first, ids, B, Tn);
    }
    auto& [replay, rc] = refs.at(D);
    if (!replay.count(name) || replay.at(name).values.shape() != got.values.shape()) continue;  // failed as a shape
    const Tensor<double>& x_ref = replay.at(name).values;
    Tensor<double> e_last = rc->expected(name, replay.at(name), wide).e;  // the sublayer's own step, at u_f32 or u_f64
    if (!wide)
      for (index_t i = 0; i < e_last.size(); ++i) e_last[i] *= io::dtype_eps(D) / io::dtype_eps(DType::f32);
    TensorReport t = report_of(name + " (end to end)", got);
    const bool estimate = opt.oracle == Oracle::fast && opt.policy != Policy::worst_case && !wide;
    bool decided = false;
    if (estimate) {
      if (!xd) xd = std::make_unique<om::ForwardResult<double>>(d.forward(ids, B, Tn, ft));
      if (!xld) xld = std::make_unique<om::ForwardResult<long double>>(d.cast<long double>().forward(ids, B, Tn, ft));
      const Tensor<double> a = traced_output<double, double>(*xd, sublayer_of(name));
      const Tensor<double> b = traced_output<long double, double>(*xld, sublayer_of(name));
      const index_t rows = a.size() / w;
      std::vector<double> E(static_cast<std::size_t>(rows));
      for (index_t r = 0; r < rows; ++r) {
        double dmax = 0, xmax = 0;
        for (index_t c = 0; c < w; ++c) {
          dmax = std::max(dmax, std::abs(a[r * w + c] - b[r * w + c]));
          xmax = std::max(xmax, std::abs(a[r * w + c]));
        }
        E[static_cast<std::size_t>(r)] = kLdSafety * (dmax + kU53 * xmax);
      }
      decided = row_verdict(name, got, x_ref, a, E, kBoundRho, e_last, w, opt, t);
      if (decided) ++estimated;
      else t = report_of(name + " (end to end)", got);
    }
    if (!decided) {
      row_verdict(name, got, x_ref, traced_output<mp50, mp50>(hp(), sublayer_of(name)), {}, 0.0, e_last, w, opt, t);
      ++exact;
    }
    t.bound = "end to end: 2 x the plain replay's row error + floor, per token row";
    out.push_back(std::move(t));
  }
  note = "sublayer outputs without their inputs (a minimal trace): besides the local check on the input their router "
         "forms, each gets an end-to-end row (\"<S>.output (end to end)\", the logits' rule: per token row, max |x - "
         "oracle| <= 2 x the row error of the plain replay in the trace's precision + floor); " +
         std::to_string(estimated) + " against the double replay (error estimated by a long double replay), " +
         std::to_string(exact) + " against the mp50 replay";
  return out;
}

}  // namespace oasis::verify::detail

// src/verify/model_grad_replays.hpp — the model-level gradient tensors of a backward result by
// report name, and the six plain replays' row errors of the end-to-end gradient rule
// (op_model_grad.cpp's header, docs/verify-model.md "Model gradients").
#pragma once

#include <cfenv>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "matrix_products.hpp"
#include "model_grad_parity.hpp"
#include "oasis/grad/model_backward.hpp"

namespace oasis::verify::detail {

namespace om = oasis::model;

template <class T>
const Tensor<T>* trace_field(const om::SublayerGradTrace<T>& tr, const std::string& f) {
  for (const auto& [name, t] : om::grad_trace_fields(tr))
    if (f == name) return t;
  return nullptr;
}

/// The tensor `name` of a backward result (nullptr: no such tensor; empty: not defined here).
template <class T>
const Tensor<T>* find_gradient(const om::ModelGrads<T>& g, const std::string& name) {
  if (name == "grad_state") return &g.state;
  if (name == "grad_embeddings") return &g.embeddings;
  if (name.rfind("grad.", 0) == 0) {
    const auto it = g.params.find(name.substr(5));
    return it == g.params.end() ? nullptr : &it->second;
  }
  const std::size_t dot = name.rfind('.');
  if (dot == std::string::npos) return nullptr;
  const std::string sub = name.substr(0, dot), field = name.substr(dot + 1);
  for (const auto& tr : g.trace)
    if (tr.name == sub) return trace_field(tr, field);
  return nullptr;
}

/// Every gradient tensor name a backward result defines (grad.<parameter>, grad_embeddings,
/// grad_state, "<sublayer>.<field>" of its non-empty trace fields).
template <class T>
std::vector<std::string> gradient_names(const om::ModelGrads<T>& g) {
  std::vector<std::string> n;
  for (const auto& [p, t] : g.params) n.push_back("grad." + p);
  n.push_back("grad_embeddings");
  n.push_back("grad_state");
  for (const auto& tr : g.trace)
    for (const auto& [f, t] : om::grad_trace_fields(tr))
      if (!t->empty()) n.push_back(tr.name + "." + f);
  return n;
}

/// The names a trace may give, for the error naming an unknown one.
template <class T>
std::string known_names(const om::ModelGrads<T>& g) {
  std::ostringstream os;
  os << "grad.<parameter> (";
  bool first = true;
  for (const auto& [n, t] : g.params) {
    (void)t;
    os << (first ? "" : ", ") << n;
    first = false;
  }
  os << "), grad_state, grad_embeddings, <sublayer>.{";
  first = true;
  const om::SublayerGradTrace<T> fields;
  for (const auto& [f, t] : om::grad_trace_fields(fields)) {
    (void)t;
    os << (first ? "" : ", ") << f;
    first = false;
  }
  os << "} for the sublayers ";
  first = true;
  for (const auto& tr : g.trace) {
    os << (first ? "" : ", ") << tr.name;
    first = false;
  }
  return os.str();
}

/// The replays' largest row error against `ref`, per checked name: the plain backward in T (its
/// forward recomputation included) rounding to nearest, upward and downward, each from dl whole and
/// as backward(hi) + backward(lo) with dl = hi + lo split exactly. Each realisation is folded into
/// the row errors as soon as it is computed (memory: one realisation and its split half at a time);
/// the forward is recorded once per rounding direction for its three backwards (the same forward
/// bit for bit as three separate model_backward calls). The caller casts the weights and
/// grad_logits to T, and the split runs, under the default rounding.
template <class T, class R>
std::map<std::string, std::vector<double>> replay_row_errors(const om::Model<T>& m, const std::vector<index_t>& ids,
                                                             index_t B, index_t Tn, const Tensor<T>& dl,
                                                             const std::vector<std::string>& names,
                                                             const om::ModelGrads<R>& ref) {
  const auto [hi, lo] = split_cotangent(dl);
  om::ForwardOptions fo;
  fo.products = &matrix_products();
  std::map<std::string, std::vector<double>> dev;
  auto backward = [&](const om::detail::ModelTape<T>& tape, const Tensor<T>& cot) {
    om::ModelGrads<T> g = om::detail::backward_from_tape(m, tape, cot, Tensor<T>());
    om::detail::accumulate_embedding_table(g, ids);
    return g;
  };
  for (int mode : {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD}) {
    const RoundingMode rm(mode);
    const om::detail::ModelTape<T> tape = om::detail::record_forward(m, m.embed(ids, B, Tn), B, Tn, fo);
    {
      const om::ModelGrads<T> g = backward(tape, dl);
      for (const std::string& n : names) add_row_deviation(dev[n], *find_gradient(g, n), *find_gradient(ref, n));
    }
    const om::ModelGrads<T> gh = backward(tape, hi), gl = backward(tape, lo);
    for (const std::string& n : names) {
      Tensor<T> x = *find_gradient(gh, n);
      const Tensor<T>& y = *find_gradient(gl, n);
      for (index_t i = 0; i < x.size(); ++i) x[i] += y[i];
      add_row_deviation(dev[n], x, *find_gradient(ref, n));
    }
  }
  return dev;
}

}  // namespace oasis::verify::detail

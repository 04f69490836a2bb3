// src/verify/layout_fold.cpp — the folding of per-sequence reports (layout_fold.hpp).
#include "layout_fold.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "tensor_check.hpp"

namespace oasis::verify::detail {
namespace {

Shape coords_of(const Shape& shape, index_t flat) {
  Shape ix(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    ix[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return ix;
}

index_t flat_of(const Shape& shape, const Shape& ix) {
  index_t f = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + ix[d];
  return f;
}

/// NaN-propagating maximum (a NaN figure of any part is the folded figure).
double fmax_nan(double a, double b) { return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b); }

/// "name[i, j, ...]<rest>" of a part's element list with the index mapped to the packed tensor;
/// the packed flat index is returned in *flat (-1, and the text unchanged, if it does not parse).
std::string remap_text(const std::string& text, const std::string& name, const PartPlace& p, const Shape& packed, index_t* flat) {
  *flat = -1;
  if (text.compare(0, name.size(), name) != 0 || text.size() <= name.size() || text[name.size()] != '[') return text;
  const std::size_t close = text.find(']', name.size());
  if (close == std::string::npos) return text;
  Shape ix;
  std::size_t at = name.size() + 1;
  while (at < close) {
    std::size_t used = 0;
    ix.push_back(static_cast<index_t>(std::stoll(text.substr(at, close - at), &used)));
    at += used;
    while (at < close && (text[at] == ',' || text[at] == ' ')) ++at;
  }
  if (ix.size() != p.dense.size()) return text;
  *flat = p.packed(flat_of(p.dense, ix));
  return name + shape_str(coords_of(packed, *flat)) + text.substr(close + 1);
}

/// The rank-ordered "worse" of error_map.cpp: NaN first, then the larger ratio, then the lower index.
bool worse(const std::pair<index_t, ElementError>& a, const std::pair<index_t, ElementError>& b) {
  const bool na = std::isnan(a.second.ratio), nb = std::isnan(b.second.ratio);
  if (na != nb) return na;
  if (!na && a.second.ratio != b.second.ratio) return a.second.ratio > b.second.ratio;
  return a.first < b.first;
}

/// A text's template (each count, a digit run not preceded by a letter or digit, replaced by '#')
/// and its counts.
std::pair<std::string, std::vector<long long>> counts_of(const std::string& text) {
  std::pair<std::string, std::vector<long long>> r;
  for (std::size_t i = 0; i < text.size();) {
    const bool after_word = i > 0 && std::isalnum(static_cast<unsigned char>(text[i - 1]));
    if (std::isdigit(static_cast<unsigned char>(text[i])) && !after_word) {
      std::size_t j = i;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      r.first += '#';
      r.second.push_back(std::stoll(text.substr(i, j - i)));
      i = j;
    } else {
      r.first += text[i++];
    }
  }
  return r;
}

/// The template with its counts filled in.
std::string fill(const std::string& tmpl, const std::vector<long long>& counts) {
  std::string s;
  std::size_t k = 0;
  for (char ch : tmpl) s += ch == '#' && k < counts.size() ? std::to_string(counts[k++]) : std::string(1, ch);
  return s;
}

}  // namespace

PartPlace contiguous_part(const Shape& dense, index_t offset) {
  return {dense, [offset](index_t f) { return offset + f; }};
}

PartPlace stat_part(index_t H, index_t total, index_t c0, index_t n) {
  return {{1, H, n}, [total, c0, n](index_t f) { return (f / n) * total + c0 + f % n; }};
}

void fold_counts(TensorReport& r, const TensorReport& t) {
  r.checked += t.checked;
  r.violations += t.violations;
  r.violations_certain += t.violations_certain;
  r.undecided += t.undecided;
  r.max_abs = fmax_nan(r.max_abs, t.max_abs);
  r.max_rel = fmax_nan(r.max_rel, t.max_rel);
  r.max_ulps = fmax_nan(r.max_ulps, t.max_ulps);
  r.worst_ratio = fmax_nan(r.worst_ratio, t.worst_ratio);
  r.worst_ratio_certain = fmax_nan(r.worst_ratio_certain, t.worst_ratio_certain);
  r.passed = r.passed && t.passed;
  r.certain_failure = r.certain_failure || t.certain_failure;
}

void ReportFold::fold_tensor(Acc& a, const TensorReport& t, const PartPlace& p, const std::string& label) {
  const Shape& packed = a.r.shape;
  TensorReport& r = a.r;
  if (!a.seen) r.passed = true;
  fold_counts(r, t);
  r.informative = a.seen ? r.informative && t.informative : t.informative;
  // the bound text (which may carry the part's own figures) of the part with the worst ratio
  const double tr = std::isnan(t.worst_ratio) ? std::numeric_limits<double>::infinity() : t.worst_ratio;
  if (!a.seen || tr > a.bound_ratio) {
    r.bound = t.bound;
    a.bound_ratio = tr;
  }
  if (!t.problem.empty()) r.problem += (r.problem.empty() ? "" : "; ") + label + ": " + t.problem;
  a.seen = true;
  for (const std::string& m : t.first_mismatches) {
    index_t f;
    std::string s = remap_text(m, t.name, p, packed, &f);
    a.mismatches.emplace_back(f, std::move(s));
  }
  for (const std::string& u : t.first_undecided) {
    index_t f;
    std::string s = remap_text(u, t.name, p, packed, &f);
    a.undecided.emplace_back(f, std::move(s));
  }
  const ErrorMap& m = t.map;
  if (m.empty()) return;
  if (a.hist.empty()) a.hist.assign(m.histogram.size(), 0);
  for (std::size_t i = 0; i < m.histogram.size() && i < a.hist.size(); ++i) a.hist[i] += m.histogram[i];
  a.nan += m.nan;
  for (const ElementError& w : m.worst) {
    ElementError e = w;
    const index_t f = p.packed(flat_of(p.dense, w.index));
    e.index = coords_of(packed, f);
    a.worst.emplace_back(f, e);
  }
  std::sort(a.worst.begin(), a.worst.end(), worse);
  if (a.worst.size() > static_cast<std::size_t>(ErrorMap::kWorst)) a.worst.resize(ErrorMap::kWorst);
  // every element of the part takes its block's cell value (-1: none checked, skipped)
  Shape cstride(m.blocks.size(), 1);
  for (std::size_t d = m.blocks.size(); d-- > 1;) cstride[d - 1] = cstride[d] * std::max<index_t>(m.blocks[d], 1);
  const index_t n = shape_numel(p.dense);
  for (index_t f = 0; f < n; ++f) {
    const Shape ix = coords_of(p.dense, f);
    index_t cell = 0;
    for (std::size_t d = 0; d < ix.size() && d < m.block.size(); ++d) cell += ix[d] / m.block[d] * cstride[d];
    const float v = m.cells[static_cast<std::size_t>(cell)];
    if (v == -1.0f) continue;
    a.cells.emplace_back(p.packed(f), v);
  }
}

void ReportFold::add(const CompareReport& part, const std::string& label, const std::map<std::string, PartPlace>& where) {
  for (const TensorReport& t : part.tensors) {
    auto w = where.find(t.name);
    auto got = outputs_.find(t.name);
    OASIS_REQUIRE(w != where.end() && got != outputs_.end(), t.name, "a sequence's check reported a tensor the call did not place");
    auto [it, fresh] = acc_.try_emplace(t.name);
    if (fresh) it->second.r = report_of(t.name, got->second);
    fold_tensor(it->second, t, w->second, label);
  }
  auto group = [&label](std::vector<std::pair<std::string, std::vector<std::string>>>& v, const std::string& text) {
    for (auto& [x, labels] : v)
      if (x == text) {
        labels.push_back(label);
        return;
      }
    v.push_back({text, {label}});
  };
  for (const std::string& n : part.notes) group(notes_, n);
  // the parts' oracle lines differ in their counts only (rows, elements recomputed): one line per
  // template, its counts summed over the parts
  auto [tmpl, counts] = counts_of(part.oracle);
  bool found = false;
  for (auto& o : oracles_)
    if (o.tmpl == tmpl) {
      for (std::size_t i = 0; i < counts.size(); ++i) o.counts[i] += counts[i];
      o.labels.push_back(label);
      found = true;
    }
  if (!found) oracles_.push_back({tmpl, counts, {label}});
  mp50_work_ += part.mp50_work;
  mp50_rows_ += part.mp50_rows;
}

CompareReport ReportFold::finish(const std::string& parts) {
  CompareReport rep;
  for (const auto& [name, got] : outputs_) {
    (void)got;
    for (const TensorReport& w : whole_)
      if (w.name == name) rep.tensors.push_back(w);
    auto it = acc_.find(name);
    if (it == acc_.end()) continue;
    Acc& a = it->second;
    TensorReport r = a.r;
    auto listed = [this](std::vector<std::pair<index_t, std::string>>& v, std::vector<std::string>& out) {
      std::stable_sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      for (std::size_t i = 0; i < v.size() && i < static_cast<std::size_t>(show_); ++i) out.push_back(v[i].second);
    };
    listed(a.mismatches, r.first_mismatches);
    listed(a.undecided, r.first_undecided);
    if (!a.cells.empty()) {
      ErrorMapBuilder b(r.shape);
      for (const auto& [f, v] : a.cells) b.note(f, 0.0, 0.0, std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : v, 1.0);
      r.map = b.finish();
      r.map.histogram = a.hist;
      r.map.nan = a.nan;
      r.map.worst.clear();
      for (const auto& w : a.worst) r.map.worst.push_back(w.second);
    }
    rep.tensors.push_back(std::move(r));
  }
  auto render = [](const std::pair<std::string, std::vector<std::string>>& g) {
    std::string s;
    for (const std::string& l : g.second) s += (s.empty() ? "" : ", ") + l;
    return s + ": " + g.first;
  };
  for (const auto& g : notes_) rep.notes.push_back(render(g));
  if (oracles_.empty()) {
    rep.oracle = "none (no sequence checked); " + parts;
  } else if (oracles_.size() == 1) {
    rep.oracle = fill(oracles_[0].tmpl, oracles_[0].counts) + "; " + parts;
  } else {
    rep.oracle = parts + "; per part: ";
    for (std::size_t i = 0; i < oracles_.size(); ++i)
      rep.oracle += (i ? "; " : "") + render({fill(oracles_[i].tmpl, oracles_[i].counts), oracles_[i].labels});
  }
  rep.mp50_work = mp50_work_;
  rep.mp50_rows = mp50_rows_;
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
  return rep;
}

bool placed(const TensorMap& outputs, const std::string& name, const Shape& want, ReportFold& fold) {
  auto it = outputs.find(name);
  if (it == outputs.end()) return false;
  if (it->second.values.shape() == want) return true;
  fold.whole(shape_mismatch(name, it->second, want));
  return false;
}

CompareReport zero_report(const std::string& name, const io::StoredTensor& slice, int show, const std::string& why) {
  static const mp50 zero(0);
  TensorCheck chk(name, slice, show);
  for (index_t i = 0; i < slice.values.size(); ++i) (void)chk.add(i, RefValue{0.0, 0.0, 0.0, &zero}, Allowed{});
  CompareReport rep;
  rep.tensors.push_back(chk.finish("exactly 0 (" + why + ")"));
  rep.oracle = "exact";
  rep.passed = rep.tensors.back().passed;
  return rep;
}

io::json::Value dense_options(const Options& o, const std::vector<std::string>& drop,
                              const std::vector<std::pair<std::string, io::json::Value>>& set) {
  io::json::Value v;
  v.kind = io::json::Value::Kind::object;
  for (const std::string& k : o.keys())
    if (std::find(drop.begin(), drop.end(), k) == drop.end()) v.members.emplace_back(k, *o.get(k));
  for (const auto& m : set) v.members.push_back(m);
  return v;
}

io::json::Value json_string(const std::string& s) {
  io::json::Value v;
  v.kind = io::json::Value::Kind::string;
  v.text = s;
  return v;
}

io::json::Value json_integers(const std::vector<index_t>& xs) {
  io::json::Value v;
  v.kind = io::json::Value::Kind::array;
  for (index_t x : xs) {
    io::json::Value n;
    n.kind = io::json::Value::Kind::number;
    n.text = std::to_string(x);
    v.items.push_back(n);
  }
  return v;
}

Tensor<index_t> integer_input(const TensorMap& in, const std::string& name, index_t rank, const std::string& shape) {
  const io::StoredTensor* t = maybe(in, name);
  OASIS_REQUIRE(t, name, "needs input tensor '", name, "' ", shape, " (the inputs hold: ", names_of(in), ")");
  OASIS_REQUIRE(io::is_integer(t->dtype), name, "must be an integer tensor (int32 or int64) ", shape, ", got dtype ",
                io::to_string(t->dtype));
  OASIS_REQUIRE(t->values.rank() == rank, name, "must have shape ", shape, ", got ", shape_str(t->values.shape()));
  Tensor<index_t> r(t->values.shape());
  for (index_t i = 0; i < r.size(); ++i) {
    const double x = t->values[i];
    OASIS_REQUIRE(std::abs(x) < 9.0e15, name, "entry ", i, " = ", x, " is out of range");
    r[i] = static_cast<index_t>(x);
  }
  return r;
}

}  // namespace oasis::verify::detail

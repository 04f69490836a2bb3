// oasis/model/schedule.hpp — the wiring (wiring.hpp) as the steps Model<T>::run executes.
//
// Model::run does not restate the wiring: it runs forward_schedule(config), compiled here from
// model_wiring(config), and the model backward (oasis/grad/model_backward.hpp) walks the same
// steps in reverse. The values handed between steps live in numbered slots (slot 0: the
// embedding rows). A step is one of
//
//   sublayer l   reads slot in[0] (what sublayer l reads), writes its raw output
//   router r     reads in[k] as its candidate k (kind, psi and name: wiring.routers[r]), writes
//                its routed state
//   add          reads in[0] and in[1], writes in[0] + in[1] (one rounding)
//
// A wired sum of n terms is n - 1 adds, left to right; a sum whose first terms were summed before
// (a block's partial sum, the previous router's candidate) extends that prefix, so a Block AttnRes
// block costs one add per sublayer. Order: for each sublayer in turn its input (running the router
// it reads: Kimi), the sublayer, then its own router when nothing has read it yet (the authors'
// router follows its sublayer); last the readout state. `release` lists the slots a step reads
// for the last time (Model::run frees them).
#pragma once

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "oasis/model/wiring.hpp"

namespace oasis::model {

struct ScheduledStep {
  enum class Kind { sublayer, router, add };
  Kind kind = Kind::add;
  index_t index = -1;            ///< sublayer l or router r (ModelWiring order); -1 for an add
  std::vector<index_t> in;       ///< the slots read: sublayer {input}; router: its candidates; add {left, right}
  index_t out = 0;               ///< the slot written
  std::vector<index_t> release;  ///< slots read for the last time by this step
};

struct ForwardSchedule {
  ModelWiring wiring;
  index_t slots = 1;                   ///< slot 0 is the embedding
  std::vector<ScheduledStep> steps;
  index_t state = 0;                   ///< the slot of the readout state
  std::vector<index_t> router_trace;   ///< per router: its entry of ForwardResult::trace
  index_t trace_entries = 0;           ///< one per sublayer, then the routers no sublayer carries (final_res)
};

/// The steps of a configuration (validated), in the order Model::run executes them.
inline ForwardSchedule forward_schedule(const ModelConfig& cfg) {
  using K = WiredValue::Kind;
  ForwardSchedule s;
  s.wiring = model_wiring(cfg);
  const ModelWiring& w = s.wiring;
  const std::size_t L = w.sublayers.size(), R = w.routers.size();
  std::vector<index_t> input(L, -1), output(L, -1), routed(R, -1);
  std::map<std::vector<index_t>, index_t> sums;  // slots summed left to right -> the slot of the sum
  auto emit = [&](ScheduledStep::Kind k, index_t i, std::vector<index_t> in) {
    s.steps.push_back({k, i, std::move(in), s.slots++, {}});
    return s.steps.back().out;
  };
  auto ready = [](index_t slot, const char* what) {
    if (slot < 0) throw std::logic_error(std::string("forward_schedule: the wiring reads ") + what + " before it is made");
    return slot;
  };
  std::function<index_t(const WiredValue&)> slot_of;
  auto run_router = [&](std::size_t r) {
    std::vector<index_t> in;
    for (const WiredCandidate& c : w.routers[r].candidates) in.push_back(slot_of(c.value));
    routed[r] = emit(ScheduledStep::Kind::router, static_cast<index_t>(r), std::move(in));
  };
  slot_of = [&](const WiredValue& v) -> index_t {
    const std::size_t i = static_cast<std::size_t>(v.index);
    switch (v.kind) {
      case K::embedding: return 0;
      case K::output: return ready(output.at(i), "a sublayer output");
      case K::input: return ready(input.at(i), "a sublayer input");
      case K::routed:
        if (routed.at(i) < 0) run_router(i);
        return routed[i];
      case K::sum: {
        std::vector<index_t> prefix;
        index_t acc = -1;
        for (const WiredValue& t : v.terms) {
          const index_t term = slot_of(t);
          prefix.push_back(term);
          if (prefix.size() == 1) { acc = term; continue; }
          const auto it = sums.find(prefix);
          acc = it != sums.end() ? it->second : (sums[prefix] = emit(ScheduledStep::Kind::add, -1, {acc, term}));
        }
        return acc;
      }
    }
    throw std::logic_error("forward_schedule: unknown wired value");
  };
  for (std::size_t l = 0; l < L; ++l) {
    input[l] = slot_of(w.sublayers[l].input);
    output[l] = emit(ScheduledStep::Kind::sublayer, static_cast<index_t>(l), {input[l]});
    const index_t r = w.sublayers[l].router;
    if (r >= 0 && routed[static_cast<std::size_t>(r)] < 0) run_router(static_cast<std::size_t>(r));
  }
  s.state = slot_of(w.state);
  s.router_trace.assign(R, -1);
  s.trace_entries = static_cast<index_t>(L);
  for (std::size_t l = 0; l < L; ++l)
    if (w.sublayers[l].router >= 0) s.router_trace[static_cast<std::size_t>(w.sublayers[l].router)] = static_cast<index_t>(l);
  for (std::size_t r = 0; r < R; ++r) {
    if (routed[r] < 0) throw std::logic_error("forward_schedule: router " + w.routers[r].trace + " is read by no step");
    if (s.router_trace[r] < 0) s.router_trace[r] = s.trace_entries++;
  }
  // Liveness: a slot is freed after its last reader (the state is read after the last step).
  std::vector<std::size_t> last(static_cast<std::size_t>(s.slots), 0);
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    last[static_cast<std::size_t>(s.steps[i].out)] = i;
    for (index_t k : s.steps[i].in) last[static_cast<std::size_t>(k)] = i;
  }
  for (index_t k = 0; k < s.slots; ++k)
    if (k != s.state) s.steps[last[static_cast<std::size_t>(k)]].release.push_back(k);
  return s;
}

}  // namespace oasis::model

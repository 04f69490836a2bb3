// tests/parity/echo_backend.cpp — the recipe "a new backend in one folder" (docs/architecture.md)
// tried on a backend that passes every op to the float reference: one table (the reference's
// ops under another name), one registration. The parity suite of this program runs over it like
// over the library's backends.
#include "echo_backend.hpp"

#include "oasis/backends/backend.hpp"

namespace oasis::test {
namespace {

// A backend outside the library registers itself at run time. This object file is part of the
// test program (the linker keeps it) and the registry is created on first use, so registering
// from a static initialiser is safe; the parity suite reads the registry after main has started
// (in its test generators, evaluated by InitGoogleTest).
[[maybe_unused]] const bool kRegistered = (register_backend(echo_backend()), true);

}  // namespace

const BackendOps& echo_backend() {
  static const BackendOps ops = [] {
    BackendOps t = backend_ops(Backend::reference);
    t.name = "echo";
    return t;
  }();
  return ops;
}

}  // namespace oasis::test

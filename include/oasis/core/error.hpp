// oasis/core/error.hpp — the one exception type the library throws for bad input.
//
// Every check names the offending argument, so a user who passes a wrongly shaped
// tensor or a NaN logit reads *which* argument and *why*, never a crash or garbage.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace oasis {

class invalid_argument : public std::invalid_argument {
 public:
  invalid_argument(std::string argument, const std::string& what)
      : std::invalid_argument("oasis: argument '" + argument + "': " + what),
        argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace oasis

// OASIS_REQUIRE(cond, "argument", message parts...) throws oasis::invalid_argument.
#define OASIS_REQUIRE(cond, arg, ...)                                            \
  do {                                                                           \
    if (!(cond)) throw ::oasis::invalid_argument((arg), ::oasis::detail::concat(__VA_ARGS__)); \
  } while (0)

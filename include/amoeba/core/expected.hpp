// A small value-or-error type (the project targets C++20, before std::expected). Used for operations whose
// failure is ordinary control flow, such as a pool shortfall: the caller branches on it, nothing throws.
#pragma once

#include <cassert>
#include <utility>
#include <variant>

namespace amoeba {

template <class E>
struct Unexpected {
  E error;
};
template <class E>
Unexpected(E) -> Unexpected<E>;

template <class T, class E>
class Expected {
 public:
  Expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}            // NOLINT: implicit by design
  Expected(Unexpected<E> e) : v_(std::in_place_index<1>, std::move(e.error)) {}  // NOLINT

  [[nodiscard]] bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  [[nodiscard]] T& value() & {
    assert(has_value() && "Expected::value() on an error");
    return std::get<0>(v_);
  }
  [[nodiscard]] const T& value() const& {
    assert(has_value() && "Expected::value() on an error");
    return std::get<0>(v_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  [[nodiscard]] const E& error() const {
    assert(!has_value() && "Expected::error() on a value");
    return std::get<1>(v_);
  }

 private:
  std::variant<T, E> v_;
};

}  // namespace amoeba

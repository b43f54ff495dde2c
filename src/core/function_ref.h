#pragma once
// A non-owning reference to something callable, for callbacks that are called before the
// function taking them returns (the thread pool's loop bodies). Unlike std::function it never
// allocates: it holds a pointer to the callable and a pointer to a function that calls it.
// The callable must outlive the reference (a lambda passed as an argument does).
#include <memory>
#include <type_traits>
#include <utility>

namespace klein {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
             std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f) noexcept  // NOLINT: implicit, like std::function
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace klein

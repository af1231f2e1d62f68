// WorkFn: the callable inside a Work item. Like std::function<void()>, but move-only and with a
// large inline buffer, so enqueueing a typical kernel launch allocates nothing.
// NOTE: the reason is the allocator, not the call: a closure malloc'd by the Python thread and
// freed by a stream's executor contends on glibc's arena lock (a futex per op in small-op loops).
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace openneuron::runtime {

class WorkFn {
 public:
  static constexpr size_t kInlineBytes = 232;

  WorkFn() = default;
  WorkFn(std::nullptr_t) {}  // NOLINT: mirrors std::function
  template <class F, class D = std::decay_t<F>,
            class = std::enable_if_t<!std::is_same_v<D, WorkFn> && std::is_invocable_v<D&>>>
  WorkFn(F&& f) {  // NOLINT: implicit, as std::function
    if constexpr (sizeof(D) <= kInlineBytes && alignof(D) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<D>) {
      new (buf_) D(std::forward<F>(f));
      ops_ = &kInlineOps<D>;
    } else {
      *reinterpret_cast<D**>(buf_) = new D(std::forward<F>(f));
      ops_ = &kHeapOps<D>;
    }
  }
  WorkFn(WorkFn&& o) noexcept { take(o); }
  WorkFn& operator=(WorkFn&& o) noexcept {
    if (this != &o) {
      reset();
      take(o);
    }
    return *this;
  }
  WorkFn& operator=(std::nullptr_t) noexcept {
    reset();
    return *this;
  }
  WorkFn(const WorkFn&) = delete;
  WorkFn& operator=(const WorkFn&) = delete;
  ~WorkFn() { reset(); }

  void operator()() { ops_->call(buf_); }
  explicit operator bool() const { return ops_ != nullptr; }

 private:
  struct Ops {
    void (*call)(void* buf);
    void (*move)(void* from, void* to) noexcept;  // leaves `from` destroyed
    void (*destroy)(void* buf) noexcept;
  };
  template <class D>
  static constexpr Ops kInlineOps = {[](void* b) { (*static_cast<D*>(b))(); },
                                     [](void* from, void* to) noexcept {
                                       new (to) D(std::move(*static_cast<D*>(from)));
                                       static_cast<D*>(from)->~D();
                                     },
                                     [](void* b) noexcept { static_cast<D*>(b)->~D(); }};
  template <class D>
  static constexpr Ops kHeapOps = {
      [](void* b) { (**static_cast<D**>(b))(); },
      [](void* from, void* to) noexcept { *static_cast<D**>(to) = *static_cast<D**>(from); },
      [](void* b) noexcept { delete *static_cast<D**>(b); }};

  void take(WorkFn& o) noexcept {
    if (o.ops_ == nullptr) return;
    o.ops_->move(o.buf_, buf_);
    ops_ = o.ops_;
    o.ops_ = nullptr;
  }
  void reset() noexcept {
    if (ops_ == nullptr) return;
    ops_->destroy(buf_);
    ops_ = nullptr;
  }

  alignas(std::max_align_t) unsigned char buf_[kInlineBytes];
  const Ops* ops_ = nullptr;
};

}  // namespace openneuron::runtime

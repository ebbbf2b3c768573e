// std::allocator's, on 64-byte boundaries: a zmm load that straddles two cache lines costs two (rows_attention's dots
// ran at half speed unaligned; qmatmul's prompt kernel 7–14 % slower). For std::vector<T, Aligned64<T>>.
#pragma once

#include <cstddef>
#include <new>

namespace {  // each kernel's own copy (its module may sit beside another built for other flags)

template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <typename U> Aligned64(const Aligned64<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <typename U> bool operator==(const Aligned64<U>&) const { return true; }
  template <typename U> bool operator!=(const Aligned64<U>&) const { return false; }
};

}  // namespace

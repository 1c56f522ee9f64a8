#include "summa/memory/arena.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace summa {

Arena::Arena(std::string name, Backend& backend, std::size_t capacity, Pool pool)
    : name_(std::move(name)), backend_(&backend), pool_(pool), capacity_(rounded(capacity)) {
  if (capacity_ > 0)
    base_ = static_cast<std::byte*>(pool_ == Pool::host ? backend_->allocate_host(capacity_)
                                                        : backend_->allocate(capacity_));
}

Arena::~Arena() {
  if (base_ == nullptr) return;
  if (pool_ == Pool::host)
    backend_->deallocate_host(base_, capacity_);
  else
    backend_->deallocate(base_, capacity_);
}

void* Arena::take_bytes(std::size_t bytes) {
  const std::size_t size = rounded(bytes);
  if (size > capacity_ - used_)
    throw Error(fmt::format("arena '{}' overflow: request of {} bytes with {} of {} bytes in use",
                            name_, bytes, used_, capacity_));
  void* p = base_ + used_;
  used_ += size;
  high_water_ = std::max(high_water_, used_);
  return p;
}

Scratch Arena::rest() {
  return Scratch{base_ + used_, capacity_ - used_};
}

void Arena::release(std::size_t mark) {
  require(mark <= used_, [&] {
    return fmt::format("arena '{}': release to {} beyond the {} bytes in use", name_, mark, used_);
  });
  used_ = mark;
}

}  // namespace summa

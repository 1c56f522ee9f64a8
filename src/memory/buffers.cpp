#include "summa/memory/buffers.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace summa {

BufferNeeds& BufferNeeds::then(const BufferNeeds& o) {
  workspace = std::max(workspace, o.workspace);
  forward += o.forward;
  backward = std::max(backward, o.backward);
  return *this;
}

std::size_t MemoryReport::total() const {
  std::size_t t = 0;
  for (const BufferUsage& b : buffers) t += b.capacity;
  return t;
}

std::string MemoryReport::to_string() const {
  std::string s = fmt::format("{:<12} {:>14} {:>14}\n", "buffer", "capacity B", "high-water B");
  for (const BufferUsage& b : buffers)
    s += fmt::format("{:<12} {:>14} {:>14}\n", b.name, b.capacity, b.high_water);
  s += fmt::format("{:<12} {:>14}\n", "total", total());
  s += fmt::format("parameters {} B, gradients {} B, activations {} B\n", parameters, gradients,
                   activations);
  return s;
}

ModelBuffers::ModelBuffers(Backend& backend, const Sizes& sizes)
    : workspace("workspace", backend, sizes.workspace),
      forward("forward", backend, sizes.forward),
      backward("backward", backend, sizes.backward),
      conjunction("conjunction", backend, sizes.conjunction),
      checkpoint("checkpoint", backend, sizes.checkpoint) {}

std::vector<BufferUsage> ModelBuffers::usage() const {
  std::vector<BufferUsage> list;
  for (const Arena* a : {&workspace, &forward, &backward, &conjunction, &checkpoint})
    list.push_back({a->name(), a->capacity(), a->high_water()});
  return list;
}

}  // namespace summa

#include "summa/comm/counters.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

std::string_view name_of(CommAxis axis) {
  switch (axis) {
    case CommAxis::world:
      return "world";
    case CommAxis::data:
      return "data";
    case CommAxis::depth:
      return "depth";
    case CommAxis::mesh_row:
      return "mesh_row";
    case CommAxis::mesh_col:
      return "mesh_col";
    case CommAxis::mesh:
      return "mesh";
    case CommAxis::tensor:
      return "tensor";
    case CommAxis::other:
      return "other";
  }
  return "?";
}

const char* name_of(Form f) {
  switch (f) {
    case Form::AB:
      return "AB";
    case Form::ABt:
      return "ABt";
    case Form::AtB:
      return "AtB";
  }
  return "?";
}

}  // namespace summa

#pragma once
/// \file spec.hpp
/// The 3D (AxoNN) scheme's options in a SchemeSpec ("3d:XxYxZ", option
/// overlap=LIST).

#include "summa/schemes/spec.hpp"

namespace summa {

struct Axonn3DSpec : SchemeOptionsOf<Axonn3DSpec> {
  Axonn3DSpec(int gx = 1, int gy = 1, int gz = 1) : gx(gx), gy(gy), gz(gz) {}
  int gx, gy, gz;  ///< the X x Y x Z grid
  /// The overlap switches (Axonn3DOptions: OAR, ORS, OAG).
  bool oar = true, ors = false, oag = false;
  friend bool operator==(const Axonn3DSpec&, const Axonn3DSpec&) = default;
};

}  // namespace summa

#pragma once
// A fourth scheme written outside the library, to show that a new scheme is
// one folder and one registry line and touches nothing else: "2dt", the 2D
// (SUMMA) scheme on a mesh whose ranks are placed transposed (world rank
// d·q² + i·q + j sits at mesh row j, column i of data group d). Its row
// reuses the 2D row's ops, options (Summa2DSpec), context and costs and
// brings its own tag, text, enumeration and grid. register_fourth_scheme()
// adds it (once) to the registry, after which every test that walks the
// registry (schemes_for: test_schemes.cpp, test_traffic.cpp) runs it
// against the serial reference and the traffic model like the built-in ones.

#include <mpi.h>

#include <string>
#include <string_view>
#include <vector>

#include "summa/summa.hpp"

namespace summa::test {

inline ProcessGrid transposed_mesh(MPI_Comm comm, const SchemeSpec& s, GridOptions o) {
  const int q = s.as<Summa2DSpec>().q, per = q * q;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const int d = rank / per, k = rank % per;
  MPI_Comm permuted = MPI_COMM_NULL;
  MPI_Comm_split(comm, 0, d * per + (k % q) * q + k / q, &permuted);
  ProcessGrid grid = ProcessGrid::mesh2d(permuted, q, s.data, std::move(o));
  MPI_Comm_free(&permuted);  // the grid keeps communicators of its own
  return grid;
}

inline const SchemeRow& fourth_scheme_row() {
  static const SchemeRow row = [] {
    SchemeRow r = scheme_row("2d");  // ops, options, costs and context: 2D's
    r.tag = "2dt";
    r.grammar = "'2dt:q=Q' (the 2D options)";
    r.parse = [](std::string_view body, std::string_view item, SchemeSpec& s) {
      scheme_row("2d").parse(body, item, s);
    };
    r.text = [](const SchemeSpec& s) { return "2dt" + scheme_row("2d").text(s).substr(2); };
    r.enumerate = [](int tensor, int data, std::vector<SchemeSpec>& out) {
      for (int q = 1; q * q <= tensor; ++q)
        if (q * q == tensor) out.emplace_back("2dt", Summa2DSpec(q), data);
    };
    r.make_grid = &transposed_mesh;
    return r;
  }();
  return row;
}

inline void register_fourth_scheme() {
  for (const SchemeRow* r : scheme_registry())
    if (r->tag == "2dt") return;
  register_scheme(fourth_scheme_row());
}

}  // namespace summa::test

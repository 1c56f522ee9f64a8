#pragma once
/// \file summa.hpp
/// Umbrella header: everything a user of summa needs.

#include "summa/backend/backend.hpp"
#include "summa/backend/cpu_backend.hpp"
#include "summa/build_info.hpp"
#include "summa/comm/communicator.hpp"
#include "summa/comm/counters.hpp"
#include "summa/comm/mpi_communicator.hpp"
#include "summa/core/error.hpp"
#include "summa/core/matrix_view.hpp"
#include "summa/core/types.hpp"
#include "summa/grid/placement.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/layernorm2d.hpp"
#include "summa/layers/linear2d.hpp"
#include "summa/memory/arena.hpp"
#include "summa/reference/gpt.hpp"
#include "summa/summa/engine.hpp"

// braid: everything a program needs to use braid's collectives.
//
//   #include <braid/braid.h>
//
//   auto comm = braid::comm::Communicator::create_world();  // from the launcher's environment
//   comm->all_reduce(data, data, count, braid::DataType::f32, braid::ReduceOp::sum).wait();
//
// Build against an installed braid with
//   c++ -std=c++20 app.cc $(pkg-config --cflags --libs braid)
// and run it under braid-launch, torchrun, srun or mpirun
// (braid/rank_info.h says what each of them sets).
#pragma once

#include "braid/communicator.h"
#include "braid/config.h"
#include "braid/dtype.h"
#include "braid/errors.h"
#include "braid/rank_info.h"
#include "braid/types.h"
#include "braid/work.h"

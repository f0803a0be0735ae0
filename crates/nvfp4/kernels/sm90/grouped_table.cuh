// sm90/grouped_table.cuh: the W4A16 grouped launch's first kernel, which only builds the work
// table (sm90/grouped.cuh's builder, one block of TABLE_THREADS threads); with 16-bit
// activations there is nothing to decode. Each W4A16 grouped module (one per activation type)
// includes it, so that a launch loads one module.
#pragma once

#include "sm90/grouped.cuh"

extern "C" __global__ void __launch_bounds__(sm90::TABLE_THREADS)
    grouped_table_sm90(const __grid_constant__ GroupedBuild b) {
  ptx::launch_dependents();  // the main kernel may start its setup; it waits for the table
  sm90::build_units<sm90::TABLE_THREADS>(b);
}

// Package gridsync holds two measurements of the GPU machine, in its tests:
// a barrier across all the workgroups of one dispatch against the boundary
// between two dependent dispatches (TestGridSync, BenchmarkGridSync: the
// route a persistent decode kernel would take, measured and not taken), and
// how many workgroups run at once for a given workgroup memory
// (TestResidentWorkgroups: what occupancy a kernel's workgroup arrays
// cost). They skip CPU adapters, where workgroups need not run at once.
package gridsync

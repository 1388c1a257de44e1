// Package tensor holds the weight formats webdraft computes with: dense f32 and
// f16 matrices and the int4 scheme of docs/reference.md (per-row groups of G
// input columns, an f16 scale per group, eight 4-bit codes per u32 word).
//
// Every format implements Matrix, whose one job is to hand out a row of W in
// f32: the reference engine multiplies with that, and the GPU engine uploads
// the raw fields unchanged.
package tensor

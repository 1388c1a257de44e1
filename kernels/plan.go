package kernels

import (
	"fmt"

	"webdraft/gpu"
)

// plan is how the kernels choose among their variants on one class of
// adapter (gpu.Class): which int4 matmul kernel takes how many activation
// rows, how many workgroups a matmul should have before it splits along K,
// and how decode attention splits a context. Everything here is a measured
// choice, not a limit of a kernel (those stay with the kernel's Go file).
type plan struct {
	// The int4 matmul kernel by activation rows T: the matrix-vector
	// kernels up to matVecMaxT rows (matvec_batch_int4.wgsl also for one
	// row of matVecBatchMinK inputs or more, and for one row of a matrix of
	// matVecBatchMinN rows or more and at least 1,024 inputs where
	// matVecBatchMinN > 0); skinny_int4.wgsl up to
	// skinnyMaxT rows and for prompt chunks of skinnyMinPrefillT rows or more; the GEMM in
	// between, at 4 × 4 outputs a thread from gemm4MinT rows, else at 2 × 8
	// or 2 × 4 from gemmMinT rows.
	matVecBatchMinK int
	matVecBatchMinN int
	// matVecBatchByShape: matvec_batch_int4.wgsl's layout by the matrix's
	// rows and the activation rows (plan.matVecBatchLayout); else
	// matVecBatchDefault everywhere.
	matVecBatchByShape bool
	// From skinnyFewMinT rows up to matVecMaxT, matrices of
	// skinnyFewMinWeights weights or more take skinny_int4.wgsl rather than
	// matvec_batch_int4.wgsl.
	skinnyFewMinT, skinnyFewMinWeights int
	// Past matVecMaxT rows, up to batchBlocksMaxT (≤ matVecBatchMaxT),
	// matrices of fewer than batchBlocksMaxWeights weights take
	// matvec_batch_int4.wgsl in blocks of four rows, unsplit (0: none).
	batchBlocksMaxT, batchBlocksMaxWeights int
	// matVec, where set, is matvec_int4.wgsl's layout at every shape
	// (else pickMatVecLayout's, the H200's by shape).
	matVec            matVecLayout
	skinnyMaxT        int
	skinnyMinPrefillT int
	// exactSkinnyTiles: skinny_int4.wgsl takes 5–20 rows that are no
	// multiple of 4 in tiles of exactly those rows (plan.skinnyLayout).
	exactSkinnyTiles bool
	// skinny_int4.wgsl's tiles of up to groupScaleMaxTT rows scale each
	// weight row's sums once per 32 inputs (its GS; 0: none). On the H200
	// (`-benchshape qwen3-8b -benchts 3,5 -cold`, 2026-12-03) five rows'
	// q|k|v, gate|up, down and head took 32.2 / 80.2 / 47.9 / 390 µs
	// against 33.1 / 82.5 / 49.2 / 407 scaling each weight (o_proj 26.6
	// against 27.0), and a verification of 5 rows of Qwen3-8B 8.31 ms
	// against 8.50 (3 rows: 7.02 against 7.03).
	groupScaleMaxTT int
	gemmMinT        int
	gemm4MinT       int

	// The workgroups a matmul should have at least (split-K below that):
	// the GEMM at 2 × n and 4 × 4 outputs a thread, skinny_int4.wgsl at up
	// to 16 and at more activation rows a workgroup (a vocabulary-sized
	// head at any), matvec_batch_int4.wgsl (0: never split).
	gemm2Groups, gemm4Groups       int
	skinnyGroups, skinnyGroupsWide int
	matVecBatchGroups              int

	// attention_decode.wgsl's tuning.
	decode decodeTuning

	// The stacked q|k|v projections that take qkv_fused_int4.wgsl (the
	// projection, the norms, RoPE and the cache append in one dispatch)
	// where the device allows it (fusesQKV): of K inputs over T rows, by
	// the first bound whose maxK takes K; none past the last.
	qkvFused []qkvFusedBound

	// One decode row's q/k norms, RoPE and cache append in
	// attention_decode.wgsl (its INPUT; AttentionBlockDecode) where
	// qkv_fused_int4.wgsl does not take its projection, or where the
	// projection has attentionInputMinK inputs or more (> 0): one dispatch
	// fewer a layer than the projection, qkv_rope_kv.wgsl and attention.
	attentionInput     bool
	attentionInputMinK int

	// One decode row's attention splits merged by o_proj as it reads them
	// (matvec_batch_int4.wgsl's MERGE; AttentionBlockDecode) rather than
	// by attention_merge.wgsl in a dispatch before it, where o_proj has up
	// to mergeInOProjMaxK inputs (0: never) — each of its workgroups reads
	// every split of every head, bytes that grow with its inputs times its
	// workgroups —, on mergeInOProjLayout where set (else o_proj's own).
	mergeInOProjMaxK   int
	mergeInOProjLayout matVecBatchLayout
}

// measuredH200 is the plan measured on the NVIDIA H200 (Vulkan), with
// `go test ./kernels -bench 'MatMulKernels|AttentionDecode|DecodeLayer'`
// and the engine's decode steps (`webdraft bench engine`), at Qwen3-1.7B's
// shapes:
//   - one row of 2,048 inputs or more (o_proj and down_proj from
//     Qwen3-0.6B on, every projection of Qwen3-4B and 8B), and one row
//     of a matrix of 6,144 rows or more (gate|up, the heads) whatever its
//     inputs from 1,024 on, take matvec_batch_int4.wgsl (matVecBatchMinK,
//     matVecBatchMinN), two weight rows a thread: for a matrix of fewer
//     than 6,144 rows (o_proj, down_proj) 64 lanes × 8 rows at one row of
//     2,048 inputs or more, 32 × 16 at two rows; one row of a head on
//     matVecBatchHead; else 16 × 32 (plan.matVecBatchLayout).
//     64 × 8 at one row (one H100, 2026-12-06, `-benchshape S -benchts 1
//     -cold`): 8B's o_proj / down_proj 11.7 / 23.5 µs against 12.9 /
//     24.8 on 32 × 16, 1.7B's 8.0 / 12.3 against 8.7 / 13.0; at two rows
//     slower (8B 16.3 / 38.3 against 13.9 / 31.0, 1.7B faster, 8.8 / 14.0
//     against 9.3 / 16.1), so two rows stay on 32 × 16. Chained steps
//     (`bench engine --shape S --context 1024 --batches 1 --rows 1
//     --steps 64`, the layouts alternated twice in one call, the next):
//     8B 3.841 / 3.844 ms against 3.912 / 3.907, 4B 2.937 / 2.936 against
//     3.115 / 3.072, 1.7B 1.712 / 1.721 against 1.759 / 1.769, 0.6B 1.331
//     / 1.327 against 1.351 / 1.343. 64 × 16 with four rows a thread was as
//     fast alone; 64 lanes at one row a thread slower (8B's o_proj 14.7–
//     18.6 µs); q|k|v on 64 × 16 × 4, faster alone (8B 14.6 µs against
//     16.2), took the 8B step to 4.48 ms beside o_proj and down_proj on
//     64 × 8 (against 3.91 on the plan before).
//     The head's layout, one row a thread and 1,024 values staged, more
//     workgroups an SM (one H100, 2026-12-06, `-benchshape S -benchts 1
//     -cold`, two rounds): 8B's head 141.0–141.5 µs against 149.2–149.4,
//     1.7B's 76.0–76.1 against 86.9–87.5; chained steps (`bench engine
//     --shape S --context 1024 --batches 1`, two alternations in one
//     call) 3.893 / 3.894 ms against 3.911 / 3.901 and 1.766 / 1.766
//     against 1.789 / 1.780; 4B's head 100.2–101.7 µs against 104.9–105.3,
//     but 0.6B's 1,024 inputs 49.0–49.3 against 45.2–45.3 (the next call),
//     so 0.6B's head stays on 16 × 32; gate|up alike on it (8B 35.3–35.7
//     µs against 35.7–36.1), not moved. Each chunk's weights loaded while the chunk
//     before is summed was no faster at any projection (same run: 8B's
//     o_proj / down_proj / gate|up 13.0 / 26.5 / 41.1 µs against 13.2 /
//     25.5 / 37.0). At Qwen3-8B's shapes (`-benchshape
//     qwen3-8b -benchts 1 -cold`, 2026-12-03, against the kernel's earlier
//     loop — one multiply-add, a dot product's share, and a swizzled read a
//     weight, one row a thread) q|k|v / o / gate|up / down / head took
//     14.8 / 12.8 / 33.3 / 24.7 / 131.6 µs against 16.0 / 14.1 / 37.5 /
//     29.5 / 161, and a chained step 3.69 ms against 4.09; at 1.7B's the
//     head 74.7 µs against matvec_int4.wgsl's 88.6 and gate|up 14.2
//     against 16.0 (q|k|v and o_proj alike: 10.1 / 8.4–9.2), and a
//     chained step 1.81 ms against 2.02. Two and four rows: 16 × 32 at
//     8B's gate|up 40.0 / 61.9 µs against 50.0 / 85.0, 32 × 16 at two rows
//     of o_proj and down_proj 14.1 / 30.6 against 16.3 / 38.5. Four
//     weight rows a thread were no faster (the heads by 1–2 µs) and slower
//     elsewhere; staging 1,024 or 4,096 columns, loading the next chunk's
//     weights during this chunk's products, and split-K were no faster;
//     8B's q|k|v (6,144 rows) on 32 × 16 was faster alone (14.8 µs against
//     16.6) but the chained step slower (3.96 ms against 3.68); 1.7B's
//     o_proj (2,048 × 2,048, on matvec_int4.wgsl while the bound was
//     more than 2,048 inputs) took chained steps of 1.718–1.743 ms
//     against 1.748–1.767 (`bench engine --shape S --context 1024
//     --batches 1`, five alternations over two calls, 2026-12-05), 0.6B's
//     1.341–1.350 against 1.345–1.368 (three);
//   - 3–4 rows of a matrix of 48M weights or more (Qwen3-8B's down_proj,
//     gate|up and head, every head) take skinny_int4.wgsl in tiles of 4
//     rows (`-benchshape qwen3-8b -benchts 2,3,4 -cold`): 40 / 67 / 330 µs
//     against matvec_batch_int4.wgsl's 55 / 85 / 429 at 3 rows, the 1.7B
//     head 170 against 220; smaller matrices are as fast or faster on
//     matvec_batch_int4.wgsl (8B's q|k|v 25.5 against 28.4), and two rows
//     stay there everywhere; on its loop of one multiply-add a weight,
//     three and four rows of 8B's gate|up, down_proj and head took 60–61 /
//     49–50 / 298–304 µs against skinny_int4.wgsl's 64 / 38–42 / 303;
//   - 5–40 rows are fastest on skinny_int4.wgsl, well ahead of the 8-row
//     tile and of the GEMM;
//   - at 64 rows the kernel benchmark favours skinny_int4.wgsl too, but a
//     decode step of 64 sequences is faster with the GEMM, so the GEMM
//     keeps 41 rows on, up to the prompt chunks of 128 rows and more, where
//     arithmetic bounds both and skinny_int4.wgsl is the faster at every
//     projection;
//   - 5–20 rows of a matrix under 2 M weights (the shipped pair's, a small
//     head's) take matvec_batch_int4.wgsl in blocks of four rows, unsplit
//     (batchBlocksMaxT, batchBlocksMaxWeights): the shipped target's 5-
//     and 7-row verifications 0.81–0.89 / 0.88–0.99 ms against 1.00–1.06
//     / 1.01–1.06 on skinny_int4.wgsl split with matmul_reduce.wgsl after
//     it, the head live at k = 6 1.92–2.06× against 1.86–1.88× (`bench
//     engine --rows`, `bench spec --live`, three alternations, 2026-12-04);
//     9 / 13 / 17 rows 0.94 / 0.93 / 1.10 ms against 1.06 / 1.18 / 1.39
//     (blocks up to 8 rows), the head's 2×8 / 4×16 trees 1.60–1.67× /
//     1.55–1.84× against 1.39–1.47× / 1.41–1.44× (two alternations, a
//     noisy call);
//   - split-K targets: 512 workgroups at two rows a thread (GEMM) and up to
//     16 rows a workgroup (skinny), 256 at 4 × 4 and at 32 rows, the best
//     of targets from 128 to 1,024; small matrices too: the shipped
//     target's projections at 5–17 rows, each split with a
//     matmul_reduce.wgsl dispatch after it (a fifth of its 7-row
//     verification, measured by leaving them out), took 1.01–1.15 ms at 7
//     rows against 1.61–1.68 unsplit below 2 M weights and 1.55–1.63
//     with each tile's last split adding the splits up through atomics
//     (as attention_decode.wgsl's MERGE; Qwen3-8B's 17 rows 20.1 ms
//     against 15.2), `bench engine --rows 5,7,9,17`, 2026-12-04,
//     BENCHMARKS.md "What a step costs the host and the GPU";
//   - decode attention: 1,024 workgroups a layer fill the GPU, 64 threads a
//     workgroup, eight values a load, splits of at least 64 positions
//     (at Qwen3-8B's 8 kv heads and 1,024 positions, one row: 19.0 µs,
//     against 22.5 and 29.0 for splits of 32 and 16); the last split
//     merges from two rows on: at one row the kernel alone is faster so
//     (17.3 µs against 19.0 with the merge dispatch, 2026-12-03), but
//     Qwen3-8B's and 4B's chained steps were slower (4.67 ms against 4.49
//     with the rest of that build's changes, 4.37 without it), as in
//     earlier rounds, and for the models whose q heads share a kv head
//     two ways (Qwen3-0.6B, 1.7B, the shipped pair) alone: 1.7B 1.86 ms
//     against 1.82, the pair's drafter 0.18 against 0.15; and with the
//     partials in plain f32 rather than atomics (2026-12-06, one H100):
//     1.7B 1.84 against 1.77;
//     one row of a model whose splits at 64 positions would make at most
//     16 workgroups (the shipped pair's two kv heads) takes, at up to 256
//     positions, one split and no merge dispatch: the
//     shipped target alone 1,075–1,143 tok/s against 1,044–1,090 with
//     64-position splits and the merge (`bench spec --live`, four runs
//     each, alternated, 2026-12-04), its single step 0.88–0.93 ms
//     against 1.00 (`bench engine --context 192`);
//   - split-K for matvec_batch_int4.wgsl's one row (Qwen3-8B's o_proj
//     and down_proj: 256 workgroups) does not pay: 13.6–21 µs against
//     14.5 for o_proj, 27.5–36 against 30.3 for down_proj, the best
//     only with the last split merging (same run);
//   - the attention input in one dispatch (qkv_fused_int4.wgsl: a head
//     vector a workgroup, up to four rows at once, on
//     matvec_batch_int4.wgsl's loop) where its 32 row groups a head
//     vector and K/128 lanes a row beat the matmul and qkv_rope_kv.wgsl
//     (`-bench 'DecodeLayer/T[0-9]+/qkv-rope-kv' -benchts 1,2,4`,
//     2026-12-04, µs a layer at 1 / 2 / 4 rows, fused against two
//     dispatches): the shipped pair's 256 inputs 6.9 / 8.8 / 12.1
//     against 12.9 / 13.1 / 13.3 (the kernel before, a workgroup a head
//     vector and row: 12.1 / 13.1 at 1 / 4 rows); Qwen3-0.6B's 1,024
//     10.8 / 13.0 / 19.6 against 16.4 / 14.6 / 16.7; Qwen3-1.7B's 2,048
//     14.3 / 18.1 / 27.4 against 17.9 / 17.5 / 20.9; Qwen3-8B's 4,096
//     23.5 / 27.9 / 43.6 at its best layout against 21.8 / 26.0 / 31.8
//     (48 workgroups, a third of the SMs, run out of instruction issue
//     there). So 8 rows up to 256 inputs, 2 up to 1,024, one up to 2,048,
//     none beyond; chained steps against the build before (two
//     alternations, one call, `bench engine`): Qwen3-1.7B 1.757 / 1.756
//     ms against 1.825 / 1.809, 0.6B 1.344 / 1.359 against 1.390 /
//     1.391, the shipped target 0.569 / 0.557 against 0.601 / 0.620
//     (context 192), Qwen3-8B unchanged (not fused); the pair live
//     (`bench spec --live`, k = 3, 4, 6 and the 4×16 tree) within the
//     runs' spread, the target alone 1,107–1,257 tok/s against
//     1,056–1,111;
//   - where qkv_fused_int4.wgsl does not take one row (Qwen3-4B's and
//     8B's), the q/k norms, RoPE and the cache append in
//     attention_decode.wgsl (attentionInput): a dispatch fewer a layer,
//     `bench engine --shape S --context 1024 --batches 1 --rows 1 --steps
//     64`, 2026-12-06: on the H200 against the build before, alternated
//     twice, Qwen3-8B 3.408 / 3.400 ms against 3.560 / 3.545 (the
//     compiled CUDA peer 3.591), 4B 2.689 / 2.652 against 2.797 / 2.837;
//     on one H100, switched by an environment variable, two calls, 8B
//     3.673–3.723 against 3.828–3.965, 4B 2.792 / 2.797 against 2.945
//     (and 3.354); the last split merging
//     instead of the merge dispatch lost again beside it (8B 4.02 ms,
//     4B 3.07–3.10, 1.7B 1.89–2.20 against 1.71–1.73), and so did each
//     thread loading its key's words before it scores them (8B
//     3.843 / 3.849 against 3.834 / 3.828, within 1 % elsewhere);
//   - one decode row of 512 inputs or more (Qwen3-0.6B's 1,024, 1.7B's
//     2,048) takes that path too rather than qkv_fused_int4.wgsl, whose
//     32 workgroups (a head vector each) leave most SMs idle there
//     (attentionInputMinK); and o_proj of up to 2,048 inputs merges
//     attention's splits as it reads them, on 32 lanes × 16 rows — half
//     the workgroups of its own layout, so half the splits' bytes read
//     again — (mergeInOProjMaxK, mergeInOProjLayout). One H100,
//     2026-12-07, `bench engine --shape S --context 1024 --batches 1
//     --rows 1 --steps 64`, a build switching them by environment
//     variables, alternated twice in one call: Qwen3-1.7B 1.739 / 1.733
//     ms on the plan before, 1.616 / 1.613 with the INPUT path, 1.569 /
//     1.577 with o_proj merging on its own 64 × 8 layout, 1.558 / 1.554
//     on 32 × 16 (the compiled CUDA peer 1.539); Qwen3-0.6B 1.322 /
//     1.315, 1.253 / 1.700, 1.213 / 1.253, 1.225 / 1.209. Qwen3-8B's
//     o_proj (4,096 inputs, 512 workgroups on 64 × 8) merging read 138 MB
//     a layer again and took its step to 4.30–4.35 ms against 3.74–4.12,
//     so larger o_proj keep the merge dispatch.
var measuredH200 = plan{
	matVecBatchMinK:       2048,
	matVecBatchMinN:       6144,
	matVecBatchByShape:    true,
	skinnyFewMinT:         3,
	skinnyFewMinWeights:   48 << 20,
	batchBlocksMaxT:       20,
	batchBlocksMaxWeights: 2 << 20,
	skinnyMaxT:            40,
	skinnyMinPrefillT:     128,
	exactSkinnyTiles:      true,
	groupScaleMaxTT:       8,
	gemmMinT:              17,
	gemm4MinT:             41,
	gemm2Groups:           512,
	gemm4Groups:           256,
	skinnyGroups:          512,
	skinnyGroupsWide:      256,
	decode:                decodeTuning{wg: 64, workgroups: 1024, maxChunk: 256, vb: 8, mergeMinRows: 2, directMaxGrid: 16},
	qkvFused:              []qkvFusedBound{{maxK: 256, maxT: 8}, {maxK: 1024, maxT: 2}, {maxK: 2048, maxT: 1}},
	attentionInput:        true,
	attentionInputMinK:    512,
	mergeInOProjMaxK:      2048,
	mergeInOProjLayout:    matVecBatchNarrow,
}

// measuredSwiftShader is the plan measured on Chromium's SwiftShader (the
// browser's CPU adapter; headless Chromium 156 on 2 shared cores), with
// `go test ./lab/kernelplan -run TestKernelPlan -v -args
// -kernelplan.bench 'MatMulKernels/(o_|qkv|down_|gate_up|head_part)/T(1|5)/'
// -kernelplan.benchtime 1x -kernelplan.args '-benchshape=embedded
// -benchts=1,5'` (and -kernelplan.bench AttentionDecode, 2 rounds), at the
// shipped pair's shapes: one row (drafting) and five (verifying k = 4).
// SwiftShader runs a dispatch in milliseconds to seconds, by its
// workgroups' barriers and threads more than by its bytes:
//   - one row: matvec_int4.wgsl at 16 lanes × 4 rows, 64 threads is the
//     fastest at every projection — 3.7 ms against 27 ms at down_proj
//     (the H200's layout; the row-tile kernel 16 ms), 8.6 ms against
//     229 ms at q|k|v, 47 ms against 323 ms at gate|up, 217 ms against
//     821 ms at the drafter's 32,768-row head; skinny_int4.wgsl 1.2–4.6×
//     slower;
//   - five rows: skinny_int4.wgsl without split-K (one workgroup target):
//     2.9–17.5 ms against 7–27 ms split to 512 workgroups; the GEMM
//     130–820 ms at its best tile, so skinny_int4.wgsl takes every row
//     count (larger ones, the prompt's 64, not measured; 2–4 rows keep
//     matvec_batch_int4.wgsl, unmeasured here); in tiles of 8 rows, not
//     of exactly five at 125 threads (the H200's exactSkinnyTiles):
//     through Dawn on SwiftShader (the kernels' test binary as wasm,
//     `-test.bench 'MatMulKernels/…/T5/skinny' -benchshape embedded
//     -benchts 5`, two runs, 2026-12-03) q|k|v, o, gate|up and down took
//     6.3–7.1 / 1.3–3.2 / 21–29 / 12–13 ms a matmul at 8 × 2 rows, 64
//     threads, against 8.3–8.5 / 6.5–8.7 / 26–29 / 20–21 at 5 × 2, 125;
//   - decode attention: one split of up to 1,024 positions (no merge),
//     64 threads, eight values a load: at five rows 11–18 ms against
//     29–38 ms at the H200's 1,024 workgroups; 128 and 256 threads slower;
//   - the attention input stays two dispatches: qkv_fused_int4.wgsl took
//     22 / 88 ms a layer at 1 / 5 rows against 19 / 25 (through Dawn on
//     SwiftShader, the kernels' test binary as wasm: `gotest.cjs …
//     -test.bench 'DecodeLayer/T[0-9]+/qkv-rope-kv' -benchshape embedded
//     -benchts 1,5`, 2026-12-03), each of its workgroups reading its
//     rows' inputs and weights again.
var measuredSwiftShader = plan{
	matVec:            matVecLayout{lanes: 16, rt: 4, wg: 64},
	matVecBatchMinK:   1 << 30,
	skinnyFewMinT:     1 << 30,
	skinnyMaxT:        1 << 30,
	skinnyMinPrefillT: 1,
	gemmMinT:          1 << 30,
	gemm4MinT:         1 << 30,
	gemm2Groups:       1,
	gemm4Groups:       1,
	skinnyGroups:      1,
	skinnyGroupsWide:  1,
	decode:            decodeTuning{wg: 64, workgroups: 1, maxChunk: 1024, vb: 8, mergeMinRows: 2},
}

// measuredBrowserGPU is the plan measured on a GPU behind a browser's
// WebGPU: the NVIDIA H200 through Dawn, Chrome's WebGPU, in Node
// (lab/dawn: `KPLAN='MatMulKernels|AttentionDecode' bash lab/dawn/h200.sh
// run`, the kernels' benchmarks as wasm, 200 iterations of 16 dependent
// calls, at the shipped pair's shapes and a context of 256). There every
// dispatch costs the host microseconds — the Go program's recording, the
// crossing into JavaScript, Dawn's validation and barriers — more than the
// pair's kernels cost the GPU:
//   - matmuls take 8–40 µs a call at one and four rows whatever the
//     layout (the head 36–60 µs), within the spread between runs, so the
//     H200's choices stay;
//   - decode attention is faster in one split of up to 1,024 positions
//     (no merge dispatch) at 128 threads and 16 values a load: 30 / 22 µs
//     a call at 1 / 4 rows against 36–46 / 42–56 µs at the H200's 1,024
//     workgroups with their merge;
//   - a small layer's attention input in one dispatch, as the H200's plan
//     has it (qkv_fused_int4.wgsl: 16 dispatches fewer a step of the
//     pair's target, at ~10 µs of Dawn's host time each): the page's mode
//     (a) at k = 3 / 4, 939 and 817 / 742 and 935 tok/s in two races
//     against 812 / 700 for the two dispatches, in one call (`h200.sh
//     run` with the build before as its base, BENCHMARKS.md "Browser";
//     the engine's own steps within the runs' spread; the kernel before
//     the present one, at up to 256 inputs — the bounds are now the
//     H200's, measured natively).
var measuredBrowserGPU = func() plan {
	p := measuredH200
	p.decode = decodeTuning{wg: 128, workgroups: 1, maxChunk: 1024, vb: 16, mergeMinRows: 2}
	return p
}()

// plans holds each class's plan. The H200's, SwiftShader's and a browser
// GPU's are measured; other GPUs and lavapipe take the H200's until they
// are (their rows here are where their own measurements go).
var plans = [gpu.NumClasses]plan{
	gpu.ClassH200:        measuredH200,
	gpu.ClassGPU:         measuredH200,
	gpu.ClassLavapipe:    measuredH200,
	gpu.ClassSwiftShader: measuredSwiftShader,
	gpu.ClassBrowserGPU:  measuredBrowserGPU,
}

// qkvFusedBound is where qkv_fused_int4.wgsl takes a q|k|v projection:
// up to maxT rows of up to maxK inputs.
type qkvFusedBound struct{ maxK, maxT int }

// fusesQKV reports whether the plan takes a q|k|v projection of K inputs
// over T rows in one dispatch (qkv_fused_int4.wgsl).
func (p *plan) fusesQKV(K, T int) bool {
	for _, b := range p.qkvFused {
		if K <= b.maxK {
			return T <= b.maxT
		}
	}
	return false
}

// fusesBeforeInput reports whether qkv_fused_int4.wgsl, where it takes
// one decode row's q|k|v projection of K inputs, takes it before
// attention_decode.wgsl's INPUT.
func (p *plan) fusesBeforeInput(K int) bool {
	return p.attentionInputMinK == 0 || K < p.attentionInputMinK
}

// mergesInOProj reports whether o_proj of one decode row, o at choice,
// merges attention's splits as it reads them (AttentionBlockDecode).
func (p *plan) mergesInOProj(o *Matrix, choice matMulChoice) bool {
	return o.K <= p.mergeInOProjMaxK && choice.kernel == kernelMatVecBatch
}

// planFor returns the plan of d's adapter class.
func planFor(d *gpu.Device) *plan { return &plans[d.Class()] }

// matMulKernel names the kernel that computes a matmul. Each has shapes it
// takes (fits); plan.pick chooses among them by the number of activation
// rows.
type matMulKernel int

const (
	kernelRowTile     matMulKernel = iota // matmul_rowtile.wgsl: any shape and format, 1 or 4–8-row tiles
	kernelMatVec                          // matvec_int4.wgsl: 1–4 rows
	kernelMatVecBatch                     // matvec_batch_int4.wgsl: 1–4 rows, one weight row a thread
	kernelGEMM2                           // gemm_int4.wgsl, 2 × 4 outputs a thread (32 × 64 tiles)
	kernelGEMM4                           // gemm_int4.wgsl, 4 × 4 outputs a thread (64 × 64 tiles)
	kernelGEMM2x8                         // gemm_int4.wgsl, 2 × 8 outputs a thread (32 × 128 tiles)
	kernelSkinny                          // skinny_int4.wgsl: weights in registers, activations broadcast
)

func (k matMulKernel) String() string {
	switch k {
	case kernelRowTile:
		return "row-tile"
	case kernelMatVec:
		return "matvec"
	case kernelMatVecBatch:
		return "matvec-batch"
	case kernelGEMM2:
		return "gemm-2"
	case kernelGEMM4:
		return "gemm-4"
	case kernelGEMM2x8:
		return "gemm-2x8"
	case kernelSkinny:
		return "skinny"
	}
	return fmt.Sprintf("matMulKernel(%d)", int(k))
}

// matMulChoice is how one matmul runs: the kernel, its layout where it has
// one, and the workgroups it should have before it splits along K.
type matMulChoice struct {
	kernel      matMulKernel
	matVec      matVecPlan        // kernelMatVec
	matVecBatch matVecBatchLayout // kernelMatVecBatch
	skinny      skinnyLayout      // kernelSkinny
	groupScale  bool              // kernelSkinny: each weight row's sums scaled once per 32 inputs (GS)
	groups      int               // kernelSkinny, kernelMatVecBatch and the GEMMs: the split-K target
	// fusedQKV: a stacked q|k|v projection goes to qkv_fused_int4.wgsl,
	// which does qkv_rope_kv.wgsl's work too (QKVProjRopeKV; the plan's
	// qkvFused bounds), the rest of the choice unused.
	fusedQKV bool
	qkvFused qkvFusedLayout // fusedQKV's layout (zero: the shape's default)
}

func (c matMulChoice) String() string {
	switch c.kernel {
	case kernelMatVec:
		return c.matVec.matVecLayout.String()
	case kernelMatVecBatch:
		if c.groups > 0 {
			return fmt.Sprintf("%v/groups=%d", c.matVecBatch, c.groups)
		}
		return c.matVecBatch.String()
	case kernelSkinny:
		if c.groupScale {
			return fmt.Sprintf("%v/gs/groups=%d", c.skinny, c.groups)
		}
		return fmt.Sprintf("%v/groups=%d", c.skinny, c.groups)
	}
	if c.kernel.isGEMM() {
		return fmt.Sprintf("%v/groups=%d", c.kernel, c.groups)
	}
	return c.kernel.String()
}

// pick returns how T rows of w run on a device with limits l: the
// matrix-vector kernels for 1–4 rows (matvec_int4.wgsl for one, but
// matvec_batch_int4.wgsl for one row of long inputs, and for 2–4 but those
// of large matrices from the plan's skinnyFewMinT rows), skinny_int4.wgsl
// and the GEMMs by the plan's row counts, and the row-tile kernel for
// whatever the int4 kernels do not take.
func (p *plan) pick(w *Matrix, T int, l gpu.Limits) matMulChoice {
	c, _ := p.choose(p.kernelFor(w, T, l), w, T, l)
	return c
}

// kernelFor is pick's kernel.
func (p *plan) kernelFor(w *Matrix, T int, l gpu.Limits) matMulKernel {
	switch {
	case T == 1 && (w.K >= p.matVecBatchMinK || p.matVecBatchMinN > 0 && w.N >= p.matVecBatchMinN && w.K >= 1024) &&
		kernelMatVecBatch.fits(w, T, l):
		return kernelMatVecBatch
	case T == 1 && kernelMatVec.fits(w, T, l):
		return kernelMatVec
	case T >= p.skinnyFewMinT && T <= matVecMaxT && w.N*w.K >= p.skinnyFewMinWeights && kernelSkinny.fits(w, T, l):
		return kernelSkinny
	case T <= matVecMaxT && kernelMatVecBatch.fits(w, T, l):
		return kernelMatVecBatch
	case T <= p.batchBlocksMaxT && w.N*w.K < p.batchBlocksMaxWeights && kernelMatVecBatch.fits(w, T, l):
		return kernelMatVecBatch
	case (T <= p.skinnyMaxT || T >= p.skinnyMinPrefillT) && kernelSkinny.fits(w, T, l):
		return kernelSkinny
	case T >= p.gemm4MinT && kernelGEMM4.fits(w, T, l):
		return kernelGEMM4
	case T >= p.gemmMinT && kernelGEMM2x8.fits(w, T, l):
		return kernelGEMM2x8
	case T >= p.gemmMinT && kernelGEMM2.fits(w, T, l):
		return kernelGEMM2
	}
	return kernelRowTile
}

// choose returns how kernel k runs T rows of w: its layout for the shape
// (matvec_int4.wgsl's with workgroups as large as the device's memory
// allows, skinny_int4.wgsl's pickSkinnyLayout) and the plan's split-K
// target; false when k does not take them.
func (p *plan) choose(k matMulKernel, w *Matrix, T int, l gpu.Limits) (matMulChoice, bool) {
	if !k.fits(w, T, l) {
		return matMulChoice{}, false
	}
	c := matMulChoice{kernel: k}
	switch {
	case k == kernelMatVec:
		c.matVec, _ = matVecFor(w, T, l)
		if p.matVec.lanes > 0 {
			if m, ok := matVecAt(p.matVec, w, T, l); ok {
				c.matVec = m
			}
		}
	case k == kernelMatVecBatch:
		c.matVecBatch = p.matVecBatchLayout(w, T, l)
		c.groups = p.matVecBatchGroups
	case k == kernelSkinny:
		c.skinny = p.skinnyLayout(w.N, T)
		c.groupScale = p.groupScales(c.skinny)
		c.groups = p.skinnyGroups
		// Wide tiles split to fewer workgroups, but a head's many
		// tiles of 17–20 rows still split in two (pickSkinnyLayout).
		if c.skinny.tt > 16 && w.N < 65536 {
			c.groups = p.skinnyGroupsWide
		}
	case k.isGEMM():
		c.groups = p.gemm2Groups
		if k.gemmTile().tm == 4 {
			c.groups = p.gemm4Groups
		}
	}
	return c, true
}

// groupScales reports whether skinny_int4.wgsl in layout l scales each
// weight row's sums once per 32 inputs (its tiles of up to
// groupScaleMaxTT rows).
func (p *plan) groupScales(l skinnyLayout) bool { return l.tt <= p.groupScaleMaxTT }

// matVecBatchLayout returns matvec_batch_int4.wgsl's layout for T rows
// of w: with matVecBatchByShape two weight rows a thread — for a matrix of
// fewer than 6,144 rows (more workgroups, a shorter loop a thread) 64
// lanes a row and 8 rows a workgroup at one row of 2,048 inputs or more,
// 32 lanes and 16 rows at two rows or fewer inputs, else 16 lanes and 32
// rows —, or for one row of a head matVecBatchHead; matVecBatchDefault
// where those do not fit the device.
func (p *plan) matVecBatchLayout(w *Matrix, T int, l gpu.Limits) matVecBatchLayout {
	if !p.matVecBatchByShape {
		return matVecBatchDefault
	}
	m := matVecBatchWide
	switch {
	case T == 1 && w.N >= matVecBatchHeadMinN && w.K >= matVecBatchHeadMinK:
		m = matVecBatchHead
	case T == 1 && w.N < 6144 && w.K >= 32*matVecBatchNarrowOne.lanes: // a vec4 of codes for each of its lanes
		m = matVecBatchNarrowOne
	case T <= 2 && w.N < 6144:
		m = matVecBatchNarrow
	}
	if !m.fits(w, T, l) {
		return matVecBatchDefault
	}
	return m
}

// fits reports whether kernel k computes T rows of w on a device with
// limits l. The int4 kernels read 32 codes at a time, which must lie in
// one scale group, and need their tiles to fit the grid.
func (k matMulKernel) fits(w *Matrix, T int, l gpu.Limits) bool {
	int4 := w.Format == Int4 && w.K%32 == 0 && w.G%32 == 0
	switch k {
	case kernelRowTile:
		return true
	case kernelMatVecBatch:
		return int4 && T <= matVecBatchMaxT && matVecBatchDefault.fits(w, T, l)
	case kernelMatVec:
		if !int4 || T > matVecMaxT {
			return false
		}
		_, ok := matVecFor(w, T, l)
		return ok
	case kernelSkinny:
		s := pickSkinnyLayout(w.N, T)
		return int4 && divCeil(w.N, s.rows()) <= l.MaxComputeWorkgroupsPerDimension &&
			s.chunk(l.MaxComputeWorkgroupStorageSize) > 0
	case kernelGEMM2, kernelGEMM4, kernelGEMM2x8:
		g := k.gemmTile()
		return int4 && w.K%g.bk() == 0 && divCeil(w.N, 16*g.tn) <= l.MaxComputeWorkgroupsPerDimension &&
			g.memory() <= l.MaxComputeWorkgroupStorageSize
	}
	return false
}

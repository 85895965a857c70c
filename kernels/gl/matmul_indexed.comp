/* R = A x B with the fused epilogue (matmul.glsl) for matrices in any layouts: the GLSL ES 3.10
 * source of the thesis's kernels (cross1, rmcm, crossv, blocked_rmrm, blocked_rmcm, morton_4_2,
 * morton_4_4). Their entries fix the layouts and the block of results per work item; here every
 * element is found through the index macros the runtime prepends for those layouts
 * (MALINN_INDEX_A, _B, _R), and an invocation computes the block the entry's "scale" gives: the
 * range is (h / rows per item) x (w / columns per item), so the block is h / malinn_range0 by
 * w / malinn_range1. Correct for every layout, at the speed of a simple kernel: the GL backend's
 * fast paths are gemm_tiled.comp and gemv.comp.
 */

#define MAX_BLOCK 4

void main() {
    MALINN_GUARD
    uint br = h / malinn_range0;
    uint bc = w / malinn_range1;
    uint row0 = MALINN_GLOBAL_X * br;
    uint col0 = MALINN_GLOBAL_Y * bc;
    float acc[MAX_BLOCK * MAX_BLOCK];
    for (int e = 0; e < MAX_BLOCK * MAX_BLOCK; ++e)
        acc[e] = 0.0;
    for (uint k = 0u; k < l; ++k)
        for (uint i = 0u; i < br; ++i) {
            float av = a[MALINN_INDEX_A(row0 + i, k, H, W)];
            for (uint j = 0u; j < bc; ++j)
                acc[i * uint(MAX_BLOCK) + j] += av * b[MALINN_INDEX_B(k, col0 + j, l, w)];
        }
    for (uint i = 0u; i < br; ++i)
        for (uint j = 0u; j < bc; ++j)
            r[MALINN_INDEX_R(row0 + i, col0 + j, h, w)] = EPILOGUE(acc[i * uint(MAX_BLOCK) + j], row0 + i, col0 + j);
}

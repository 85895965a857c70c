/* Element-wise activations for R in any layout (Rovder 6.2, 9.2), in place.
 *
 * -DACTIVATION=act_<name> picks one of the macros of activations.clh (prepended by the runtime:
 * "includes" in kernels/library.json); a new activation is a macro there and an entry in the
 * library. Parametrised activations read p0..p3: float arguments, the 'p' letters of the entry's
 * arglist, named with defaults under "params", values from the layer's config.
 * The runtime also prepends MALINN_INDEX_R(row, col, prows, pcols) for R's layout. m, n are R's
 * logical rows and columns, h, w its padded ones. Only logical elements are touched: the padding
 * stays zero, so whatever an activation maps 0 to never reaches the next layer. OpenCL C 1.2.
 */

__kernel void activation(uint m, uint n, uint h, uint w,
                         float p0, float p1, float p2, float p3,
                         __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    const size_t ix = MALINN_INDEX_R(row, col, h, w);
    const float x = r[ix];
    r[ix] = ACTIVATION(x);
}

/* Element-wise activations for R in any layout (Rovder 6.2, 9.2), in place.
 *
 * -DACTIVATION=act_<name> picks one of the act_<name> macros below; kernels/library.json has one entry
 * per activation, so a new activation is a macro here and an entry there. The runtime prepends
 * MALINN_INDEX_R(row, col, prows, pcols) for R's layout. m, n are R's logical rows and columns,
 * h, w its padded ones. Only logical elements are touched: the padding stays zero, so whatever an
 * activation maps 0 to never reaches the next layer. NaN propagates, as in TensorFlow.
 * OpenCL C 1.2.
 */

#define act_relu(x)     ((x) < 0.0f ? 0.0f : (x))
#define act_sigmoid(x)  (1.0f / (1.0f + exp(-(x))))
#define act_tanh(x)     tanh(x)

__kernel void activation(uint m, uint n, uint h, uint w, __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    const size_t ix = MALINN_INDEX_R(row, col, h, w);
    const float x = r[ix];
    r[ix] = ACTIVATION(x);
}

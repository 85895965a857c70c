/* Element-wise activations for R in any layout (Rovder 6.2, 9.2), in place.
 *
 * -DACTIVATION=act_<name> picks one of the act_<name>(x) macros below; kernels/library.json has one
 * entry per activation, so a new activation is a macro here and an entry there. Parametrised
 * activations read their parameters p0..p3 (float kernel arguments: 'p' letters in the entry's arglist,
 * named with defaults under "params" in the library, values from the layer's config), so a new value needs no rebuild.
 * The runtime prepends MALINN_INDEX_R(row, col, prows, pcols) for R's layout. m, n are R's logical
 * rows and columns, h, w its padded ones. Only logical elements are touched: the padding stays
 * zero, so whatever an activation maps 0 to never reaches the next layer. NaN propagates, as in
 * TensorFlow. Formulas follow Keras 3's (keras/src/activations) unless the name says keras2.
 * OpenCL C 1.2.
 */

#define act_relu(x)          ((x) < 0.0f ? 0.0f : (x))
#define act_relu6(x)         ((x) < 0.0f ? 0.0f : ((x) > 6.0f ? 6.0f : (x)))
#define act_sigmoid(x)       (1.0f / (1.0f + exp(-(x))))
#define act_tanh(x)          tanh(x)
#define act_exponential(x)   exp(x)
#define act_softsign(x)      ((x) / (1.0f + fabs(x)))
/* max(x, 0) + log1p(exp(-|x|)): no overflow for large |x| */
#define act_softplus(x)      (((x) < 0.0f ? 0.0f : (x)) + log1p(exp(-fabs(x))))
#define act_swish(x)         ((x) / (1.0f + exp(-(x))))
/* Keras 3: relu6(x + 3) / 6 */
#define act_hard_sigmoid(x)  (act_relu6((x) + 3.0f) / 6.0f)
/* Keras 2 / tf_keras: clip(0.2 x + 0.5, 0, 1) */
#define act_hard_sigmoid_keras2(x) act_clip01(0.2f * (x) + 0.5f)
#define act_clip01(y)        ((y) < 0.0f ? 0.0f : ((y) > 1.0f ? 1.0f : (y)))
#define act_hard_swish(x)    ((x) * act_hard_sigmoid(x))
#define act_gelu(x)          (0.5f * (x) * (1.0f + erf((x) * 0.70710678118654752f)))
#define act_gelu_tanh(x)     (0.5f * (x) * (1.0f + tanh(0.79788456080286536f * ((x) + 0.044715f * (x) * (x) * (x)))))
#define act_selu(x)          (1.0507009873554805f * ((x) > 0.0f ? (x) : 1.6732632423543772f * expm1(x)))
#define act_mish(x)          ((x) * tanh(act_softplus(x)))
/* p0 = alpha */
#define act_elu(x)           ((x) > 0.0f ? (x) : p0 * expm1(x))
/* p0 = negative slope */
#define act_leaky_relu(x)    ((x) < 0.0f ? p0 * (x) : (x))
/* Keras's relu(x, negative_slope=p0, max_value=p1, threshold=p2); p3 = 1 when max_value is set */
#define act_relu_general(x) (act_relu_general_pos(x) - (p0 != 0.0f ? p0 * act_relu(p2 - (x)) : 0.0f))
#define act_relu_general_pos(x) (p3 != 0.0f ? act_clip0max(act_relu_general_thr(x), p1) : act_relu_general_thr(x))
#define act_clip0max(y, top)  ((y) < 0.0f ? 0.0f : ((y) > (top) ? (top) : (y)))
#define act_relu_general_thr(x) (p2 != 0.0f ? ((x) > p2 ? (x) : 0.0f) : act_relu(x))

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

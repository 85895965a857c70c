/* Activation functions as macros act_<name>(x), the GLSL ES 3.10 twin of activations.clh, shared
 * by activation.comp and the fused epilogue of the matrix-multiply shaders (listed under
 * "sources.gl.includes" in kernels/library.json; the runtime prepends it). Parametrised ones read
 * p0..p3 (members of the shader's MALINN_ARGS block). Formulas follow Keras 3's unless the name
 * says keras2. GLSL ES has no erf, log1p or expm1, and its tanh may overflow for large |x|: the
 * functions below give them to float precision.
 */

/* e^x - 1 without cancellation near 0 (Kahan's trick: (u - 1) x / log u with u = e^x) */
float malinn_expm1(float x) {
    float u = exp(x);
    if (u == 1.0) return x;
    float um1 = u - 1.0;
    if (um1 == -1.0) return -1.0;
    if (isinf(u)) return u;
    return um1 * x / log(u);
}

/* log(1 + y) without cancellation near 0 (Goldberg's trick) */
float malinn_log1p(float y) {
    float u = 1.0 + y;
    return u == 1.0 ? y : log(u) * (y / (u - 1.0));
}

/* tanh through expm1 of -2|x|: no overflow, and exact to float precision near 0 */
float malinn_tanh(float x) {
    float e = malinn_expm1(-2.0 * abs(x));
    float t = -e / (2.0 + e);
    return x < 0.0 ? -t : t;
}

/* erf, Abramowitz & Stegun 7.1.28 refined to 7.1.26's form with W. J. Cody's coefficients is
 * overkill here: A&S 7.1.26 has |error| <= 1.5e-7, below float32's resolution of erf near 1 */
float malinn_erf(float x) {
    float t = 1.0 / (1.0 + 0.3275911 * abs(x));
    float y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
                     + 0.254829592) * t * exp(-x * x);
    return x < 0.0 ? -y : y;
}

#define act_linear(x)        (x)
#define act_relu(x)          ((x) < 0.0 ? 0.0 : (x))
#define act_relu6(x)         ((x) < 0.0 ? 0.0 : ((x) > 6.0 ? 6.0 : (x)))
#define act_sigmoid(x)       (1.0 / (1.0 + exp(-(x))))
#define act_tanh(x)          malinn_tanh(x)
#define act_exponential(x)   exp(x)
#define act_softsign(x)      ((x) / (1.0 + abs(x)))
/* max(x, 0) + log1p(exp(-|x|)): no overflow for large |x| */
#define act_softplus(x)      (((x) < 0.0 ? 0.0 : (x)) + malinn_log1p(exp(-abs(x))))
#define act_swish(x)         ((x) / (1.0 + exp(-(x))))
/* Keras 3: relu6(x + 3) / 6 */
#define act_hard_sigmoid(x)  (act_relu6((x) + 3.0) / 6.0)
/* Keras 2 / tf_keras: clip(0.2 x + 0.5, 0, 1) */
#define act_hard_sigmoid_keras2(x) act_clip01(0.2 * (x) + 0.5)
#define act_clip01(y)        ((y) < 0.0 ? 0.0 : ((y) > 1.0 ? 1.0 : (y)))
#define act_hard_swish(x)    ((x) * act_hard_sigmoid(x))
#define act_gelu(x)          (0.5 * (x) * (1.0 + malinn_erf((x) * 0.70710678118654752)))
#define act_gelu_tanh(x)     (0.5 * (x) * (1.0 + malinn_tanh(0.79788456080286536 * ((x) + 0.044715 * (x) * (x) * (x)))))
#define act_selu(x)          (1.0507009873554805 * ((x) > 0.0 ? (x) : 1.6732632423543772 * malinn_expm1(x)))
#define act_mish(x)          ((x) * malinn_tanh(act_softplus(x)))
/* p0 = alpha */
#define act_elu(x)           ((x) > 0.0 ? (x) : p0 * malinn_expm1(x))
/* p0 = negative slope */
#define act_leaky_relu(x)    ((x) < 0.0 ? p0 * (x) : (x))
/* Keras's relu(x, negative_slope=p0, max_value=p1, threshold=p2); p3 = 1 when max_value is set */
#define act_relu_general(x) (act_relu_general_pos(x) - (p0 != 0.0 ? p0 * act_relu(p2 - (x)) : 0.0))
#define act_relu_general_pos(x) (p3 != 0.0 ? act_clip0max(act_relu_general_thr(x), p1) : act_relu_general_thr(x))
#define act_clip0max(y, top)  ((y) < 0.0 ? 0.0 : ((y) > (top) ? (top) : (y)))
#define act_relu_general_thr(x) (p2 != 0.0 ? ((x) > p2 ? (x) : 0.0) : act_relu(x))

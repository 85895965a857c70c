/* The geometry of a window over images (the GLSL ES 3.10 twin of window.clh), shared by the
 * pooling and pixel-moving shaders: compile-time defines the plan sets per layer.
 *   IH, IW  input height and width      OH, OW  output height and width
 *   KH, KW  window (kernel) size        SH, SW  strides
 *   DH, DW  dilation                    PT, PL  padding at the top and the left
 * A result's column is (image * OH + oy) * OW + ox; window_pixel splits it into (image, oy, ox).
 */

#ifndef IH
#define IH 1
#endif
#ifndef IW
#define IW 1
#endif
#ifndef OH
#define OH 1
#endif
#ifndef OW
#define OW 1
#endif
#ifndef KH
#define KH 1
#endif
#ifndef KW
#define KW 1
#endif
#ifndef SH
#define SH 1
#endif
#ifndef SW
#define SW 1
#endif
#ifndef DH
#define DH 1
#endif
#ifndef DW
#define DW 1
#endif
#ifndef PT
#define PT 0
#endif
#ifndef PL
#define PL 0
#endif

uvec3 window_pixel(uint col) {
    uint rest = col / uint(OW);
    return uvec3(rest / uint(OH), rest % uint(OH), col % uint(OW));
}

/* The geometry of a window over volumes (the GLSL ES 3.10 twin of volume.clh), shared by the
 * shaders of Keras's 3-D layers (conv3d.comp, conv3d_transpose.comp, pool3d.comp, spatial3d.comp):
 * a tensor (batch, depth, height, width, channels) is the matrix channels x
 * (batch*depth*height*width), its column (((image*D + z)*H + y)*W + x). Compile-time defines the
 * plan sets per layer (the OpenCL sources take the sizes, strides and padding as arguments; a GLSL
 * source takes them all as defines, so each layer's geometry is a program of its own):
 *   ID, IH, IW  input depth, height, width (default 1)    OD, OH, OW  output depth, height, width (1)
 *   KD, KH, KW  window (kernel) size (1)                  SD, SH, SW  strides (1)
 *   DD, DH, DW  dilation (1)                              PF, PT, PL  padding before the first voxel
 *                                                                     (front, top, left; 0)
 * volume_voxel splits a result's column into (image, z, y, x).
 */

#ifndef ID
#define ID 1
#endif
#ifndef IH
#define IH 1
#endif
#ifndef IW
#define IW 1
#endif
#ifndef OD
#define OD 1
#endif
#ifndef OH
#define OH 1
#endif
#ifndef OW
#define OW 1
#endif
#ifndef KD
#define KD 1
#endif
#ifndef KH
#define KH 1
#endif
#ifndef KW
#define KW 1
#endif
#ifndef SD
#define SD 1
#endif
#ifndef SH
#define SH 1
#endif
#ifndef SW
#define SW 1
#endif
#ifndef DD
#define DD 1
#endif
#ifndef DH
#define DH 1
#endif
#ifndef DW
#define DW 1
#endif
#ifndef PF
#define PF 0
#endif
#ifndef PT
#define PT 0
#endif
#ifndef PL
#define PL 0
#endif

/* (image, z, y, x) of the voxel at result column col */
uvec4 volume_voxel(uint col) {
    uint line = col / uint(OW);       /* (image*OD + z)*OH + y */
    uint plane = line / uint(OH);     /* image*OD + z */
    uint image = plane / uint(OD);
    return uvec4(image, plane - image * uint(OD), line - plane * uint(OH), col - line * uint(OW));
}

// llama.cpp's (libmtmd's) preprocessed pixels for an RGB image: the f32 buffers the encoder sees.
// Built and run by tools/make_vision_fixtures.py against llama-cpp-python's libmtmd and its sdist's headers.
// usage: mtmd_preproc_dump MMPROJ RGB_FILE W H KIND(fixed|dyn|idefics3|lfm2) OUT
// OUT: per entry (the overview first, when there is one) int32 nx, ny, then nx*ny*3 float32
// (interleaved RGB, rows top down)
#include "clip.h"
#include "clip-impl.h"
#include "mtmd-image.h"
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
int main(int argc, char **argv) {
    if (argc != 7) return 2;
    clip_context_params p{};
    p.use_gpu = false; p.flash_attn_type = CLIP_FLASH_ATTN_TYPE_DISABLED; p.warmup = false;
    p.image_min_tokens = -1; p.image_max_tokens = -1;
    clip_init_result r = clip_init(argv[1], p);
    if (!r.ctx_v) return 3;
    std::ifstream f(argv[2], std::ios::binary);
    std::vector<uint8_t> rgb((std::istreambuf_iterator<char>(f)), {});
    clip_image_u8 img; img.set_size({atoi(argv[3]), atoi(argv[4])}, false); img.cpy_buf(rgb);
    std::string kind = argv[5];
    mtmd_image_preproc_out out;
    if (kind == "fixed") out = mtmd_image_preprocessor_fixed_size(r.ctx_v).preprocess(img);
    else if (kind == "dyn") out = mtmd_image_preprocessor_dyn_size(r.ctx_v).preprocess(img);
    else if (kind == "idefics3") out = mtmd_image_preprocessor_idefics3(r.ctx_v).preprocess(img);
    else if (kind == "lfm2") out = mtmd_image_preprocessor_lfm2(r.ctx_v).preprocess(img);
    else return 4;
    FILE *o = fopen(argv[6], "wb");
    std::vector<const clip_image_f32 *> all;
    if (out.has_overview()) all.push_back(&out.overview);
    for (auto &e : out.entries) all.push_back(&e);
    for (const clip_image_f32 *ep : all) {
        const clip_image_f32 &e = *ep;
        int32_t wh[2] = {e.nx(), e.ny()};
        fwrite(wh, 4, 2, o);
        fwrite(e.get_ro_buf().data(), 4, e.get_ro_buf().size(), o);
    }
    fclose(o);
    clip_free(r.ctx_v);
    return 0;
}

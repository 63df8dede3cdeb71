# rase/kernels/_kernels.pxd: the C boundary of rase.kernels._kernels, declared once (every header it calls into).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from "_simd.h" nogil:
    int RASE_ISA_SCALAR
    int RASE_ISA_AVX2
    int RASE_ISA_AVX512
    int RASE_ISA_COUNT
    const char *RASE_ISA_NAMES[]
    int rase_isa
    int rase_isa_compiled(int isa)
    int rase_isa_supported(int isa)
    int rase_isa_best()
    int rase_prefetch_bytes
    int rase_prefetch_default()
    void rase_cpu_vendor(char *out)
    void rase_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n, int isa)

cdef extern from *:
    """
    #ifdef _OPENMP
    #  include <omp.h>
    #  define RASE_OPENMP _OPENMP
    static int rase_omp_max_threads(void) { return omp_get_max_threads(); }
    #else
    #  define RASE_OPENMP 0
    static int rase_omp_max_threads(void) { return 1; }
    #endif
    #ifdef __clang__
    #  define RASE_COMPILER "clang " __clang_version__
    #elif defined(__GNUC__)
    #  define RASE_COMPILER "gcc " __VERSION__
    #else
    #  define RASE_COMPILER "unknown"
    #endif
    """
    int RASE_OPENMP
    const char *RASE_COMPILER
    int rase_omp_max_threads() nogil

cdef extern from "_traits.h" nogil:
    ctypedef void (*rase_dequant_fn)(const void *src, float *dst, int64_t n) noexcept nogil
    ctypedef void (*rase_dotn_fn)(int64_t n, const void *w, const void *a, size_t astride,
                                  int nt, float *out) noexcept nogil
    ctypedef void (*rase_quant_fn)(const float *x, void *dst, int64_t n) noexcept nogil
    ctypedef struct rase_type_traits:  # one row per ggml type (_types.h)
        const char *name
        int blck
        int size
        int act
        rase_dequant_fn dequant[3]  # [RASE_ISA_COUNT] (4 on aarch64): only indexed here
        rase_dotn_fn dotn[3]
        int rows_act
        size_t r16_blk
        int block_sum
    int RASE_GGML_TYPE_COUNT
    const rase_type_traits *rase_traits(int qtype)
    rase_dequant_fn rase_dequant_for(int qtype, int isa)
    int RASE_NT
    int ACT_F32, ACT_Q8_0, ACT_Q8_1, ACT_Q8_K, ACT_F32C, ACT_COUNT
    size_t rase_act_bytes(int act, int64_t n)
    size_t rase_act_row_stride(int act, int64_t n)
    int rase_act_for(int qtype, int isa, int T, int64_t n)
    rase_dotn_fn rase_dotn_for(int qtype, int isa)
    rase_quant_fn rase_act_quant_for(int act, int isa)
    int RASE_LAYOUT_R16
    int RASE_R16
    int RASE_CHUNK_ROWS
    void rase_r16_rows(int isa, int type, const uint8_t *packed, int64_t group_bytes, int64_t n, const uint8_t *A,
                       size_t as_, int T, float *Y, int64_t ys, int64_t r0, int64_t r1, uint8_t *work)
    size_t rase_r16_bytes(int qtype, int64_t rows, int64_t n)
    void rase_r16_repack(int qtype, const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, uint8_t *dst,
                         int64_t g0, int64_t g1, int n_threads)
    void rase_r16_unpack_row(int qtype, const uint8_t *packed, int64_t group_bytes, int64_t n, int64_t row,
                             uint8_t *dst)

cdef extern from "_traits.h" nogil:
    ctypedef void (*rase_quantize_fn)(const float *x, void *y, int64_t k) noexcept nogil
    rase_quantize_fn rase_quantize_for(int qtype, int isa)
    void rase_quantize_rows(rase_quantize_fn q, const uint8_t *src, int src_type, size_t src_row, int64_t nrows,
                            int64_t ncols, uint8_t *dst, size_t row_bytes, float *scratch, int nthreads)

cdef extern from "_sample.h" nogil:
    ctypedef struct rase_rng:
        uint64_t s[4]
    ctypedef struct rase_sampling:
        float temperature
        int top_k
        float top_p
        float min_p
        float repeat_penalty
        float presence_penalty
        float frequency_penalty
        const float *bias
    ctypedef struct rase_cand:
        float logit
        int32_t id
    void rase_rng_seed(rase_rng *r, uint64_t seed)
    uint64_t rase_rng_next(rase_rng *r)
    int RASE_SAMPLE_INVALID
    int RASE_SAMPLE_NONE
    int64_t RASE_SAMPLE_WORK(int64_t n)
    int32_t rase_sample(const float *logits, int32_t n, const int32_t *counts, const rase_sampling *p,
                        rase_rng *rng, rase_cand *work, const uint32_t *allow)

cdef extern from "_forward.h" nogil:
    int RASE_KV_BLOCK
    int RASE_GATING_SOFTMAX, RASE_GATING_SOFTMAX_WEIGHT
    int RASE_MIXER_ATTENTION, RASE_MIXER_SHORTCONV, RASE_MIXER_DELTANET
    ctypedef struct rase_mat:
        const uint8_t *data
        int type
        int64_t rows, cols, row_bytes
        int layout
        const uint8_t *packed
        int64_t group_bytes
    ctypedef struct rase_layer:
        rase_mat wq, wk, wv, wo, wgate, wup, wdown
        const float *attn_norm
        const float *ffn_norm
        const float *q_norm
        const float *k_norm
        const float *post_attn_norm
        const float *post_ffn_norm
        const float *post_attn_norm_b
        const float *post_ffn_norm_b
        const float *bq
        const float *bk
        const float *bv
        const float *bo
        const float *bgate
        const float *bup
        const float *bdown
        const float *sinks
        int qk_norm_full, window, rope_slot, moe
        rase_mat gate_inp
        const rase_mat *exp_gate
        const rase_mat *exp_up
        const rase_mat *exp_down
        const float *gate_inp_b
        const float *exp_bgate
        const float *exp_bup
        const float *exp_bdown
        int mixer, kv_layer
        rase_mat conv_in, conv_out
        const float *conv_w
        int64_t state_off
        rase_mat ssm_z, ssm_beta, ssm_alpha
        const float *ssm_dt
        const float *ssm_a
        const float *ssm_norm
    ctypedef struct rase_rope_params:
        float base, freq_scale, ext_factor, attn_factor
        float corr_dims[2]
        const float *factors
    ctypedef struct rase_hparams:
        int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_rot, n_ctx
        int rope_neox, gelu, attn_prescale
        float eps, embd_scale, attn_scale, attn_softcap, final_softcap, residual_scale, logit_mul
        int layer_norm, norm_after_add, causal
        int n_expert, n_expert_used, n_ff_exp, expert_norm, expert_gating
        float swiglu_limit, swiglu_alpha
        rase_rope_params rope[2]
        int n_conv, n_kv_layer, ssm_head, ssm_k_heads, ssm_v_heads, attn_gate
        int rope_multi, rope_sect_t, rope_sect_h, rope_sect_w, rope_sect_e
        int64_t state_floats
    ctypedef struct rase_hparam_field:
        const char *name
        int offset, is_float
    const rase_hparam_field RASE_HPARAM_FIELDS[]
    int RASE_HPARAM_COUNT
    ctypedef struct rase_weights:
        rase_hparams hp
        rase_mat tok_embd, output, pos_embd
        const float *type_embd
        const float *embd_norm
        const float *embd_norm_b
        const float *output_norm
        rase_layer *layers
    ctypedef struct rase_kv_pool:
        int32_t n_blocks, n_slots, type, row_elems, rot_k, rot_v
        int64_t state_floats
    ctypedef struct rase_scratch_need:
        int64_t g, u, att, mix, gates, cols
    ctypedef struct rase_scratch:
        int max_rows, n_threads, nonfinite
    ctypedef struct rase_entry:
        int32_t token, seq, pos
    ctypedef struct rase_batch:
        const rase_entry *rows
        int n
        const int32_t *tables
        int64_t table_stride
        const int32_t *out_rows
        int n_out
        float *logits
        const int32_t *seq_len
        const int32_t *seq_first
        const int32_t *slots
        const int32_t *embd_rows
        int n_embd
        float *embd
        const float *in_embd
        const int32_t *in_row
        const int32_t *key_end
        const int32_t *rope_pos
    ctypedef struct rase_sampler_ref:
        const rase_sampling *p
        rase_rng *rng
        rase_cand *work
        const int32_t *counts
        const uint32_t *allow
    ctypedef struct rase_model:
        const rase_weights *w
        rase_kv_pool *kv
        rase_scratch *s
        int isa
        float *trace
        int profile
        int64_t prof_matmul_ns, prof_attn_ns
        int64_t step_ns
    int rase_weights_init(rase_weights *w)
    void rase_weights_free(rase_weights *w)
    int rase_kv_pool_alloc(rase_kv_pool *kv, const rase_hparams *hp, int32_t n_blocks, int32_t n_slots, int type,
                           int rotate)
    void rase_state_copy(rase_kv_pool *kv, int32_t src, int32_t dst)
    void rase_kv_pool_free(rase_kv_pool *kv)
    void rase_kv_copy_rows(rase_kv_pool *kv, int32_t src, int32_t dst, int n)
    int rase_scratch_alloc(rase_scratch *s, const rase_hparams *hp, const rase_scratch_need *need, int max_rows,
                           int n_threads)
    rase_scratch_need rase_forward_needs(const rase_weights *w)
    void rase_scratch_free(rase_scratch *s)
    void rase_step(rase_model *m, const rase_batch *b, const rase_sampler_ref *samplers, int32_t *tokens)

cdef extern from "_attention.h" nogil:
    ctypedef struct rase_kv_view:
        const uint16_t *k
        const uint16_t *v
        const int32_t *table
        int64_t block_stride, row_stride
        int type
    int RASE_ATTN_G
    int rase_kv_row_elems(int type, int hd)
    ctypedef struct block_q8_0:
        uint16_t d
    void rase_kv_store_row(int type, const float *x, uint16_t *dst, int hd, int isa)
    void attend_fa_ref(const float *q, const rase_kv_view *kv, int type, int j0, int j1, int hd, float scale,
                       float softcap, float sink, block_q8_0 *qq, float *out)
    int64_t rase_attend_scratch(int64_t n_ctx, int hd)
    void rase_attend(int g, const float *const *q, const rase_kv_view *kv, int j0, int j1, int hd,
                     float scale, float softcap, const float *sinks, float *scratch, int64_t qstride,
                     float *const *out, int isa)
    void attend_ggml_ref(const float *q, const rase_kv_view *kv, int j0, int j1, int hd, float scale,
                         float softcap, float sink, float *scratch, float *out)
    void rase_attend_f32(const float *q, const float *k, const float *v, int64_t ks, int n, int hd, float scale,
                         float *s, float *out, int isa)

cdef extern from "_forward.h" nogil:
    void rase_gate(float *g, const float *u, int64_t n, const uint16_t *gelu_table, int isa)
    void rase_swiglu_oai(float *g, const float *u, int64_t n, float alpha, float limit)
    void rase_rope(float *x, const float *cs, int n_rot, int neox, int isa)
    void rase_rope_init(rase_rope_params *r, int n_rot, float base, float freq_scale, int yarn, float attn_factor,
                        int n_ctx_orig, const float *factors)
    void rase_rope_table(float *cs, int pos, int n_rot, const rase_rope_params *r)
    uint16_t *rase_gelu_table_new()

cdef extern from "_conv.h" nogil:
    ctypedef void (*rase_conv_fn)(int d, const float *x, int64_t E, const float *w, const float *src, float *dst,
                                  float *y, int64_t c0, int64_t c1)
    rase_conv_fn RASE_CONV[3]
    int RASE_CONV_MAX
    void rase_shortconv_row(int isa, int d, const float *bcx, int64_t E, const float *w, const float *src,
                            float *dst, float *y, int64_t c0, int64_t c1)

cdef extern from "_deltanet.h" nogil:
    ctypedef void (*rase_delta_fn)(int64_t S, float *st, const float *q, const float *k, const float *v, float g,
                                   float beta, float *delta, float *o)
    rase_delta_fn RASE_DELTA[3]

cdef extern from "_simd.h" nogil:
    """
    #if RASE_HAVE_X86
    RASE_TARGET_AVX2 static void rase_expf_avx2_n(const float *x, float *y, int64_t n) {
        for (int64_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, rase_avx2_expf(_mm256_loadu_ps(x + i)));
    }
    #else
    static void rase_expf_avx2_n(const float *x, float *y, int64_t n) { (void)x; (void)y; (void)n; }
    #endif
    """
    void rase_expf_avx2_n(const float *x, float *y, int64_t n)

cdef extern from "_bench.h" nogil:
    int64_t rase_bench_matmul(int isa, const rase_mat *w, const uint8_t *A, size_t as_, int T, float *Y,
                              int n_threads, int reps)
    int64_t rase_bench_read(const uint8_t *buf, int64_t n, int n_threads, int reps, int64_t *sink)

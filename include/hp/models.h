/* hp/models.h — model builders: each emits a forward graph whose single output is the scalar
 * loss; hp_model_build_joint runs autodiff on top to give the joint graph.
 *
 * Llama-3 follows torchtitan (FQNs, flavors, init): RMSNorm (eps 1e-5), RoPE (theta 500000,
 * adjacent pairs), grouped-query causal attention scaled by 1/sqrt(head_dim), SwiGLU
 * feed-forward w2(silu(w1 x) * w3 x), untied output, mean cross-entropy over all tokens.
 * Inputs: parameters in torchtitan's named_parameters order, then data `tokens` [B, T] i64
 * and `labels` [B, T] i64.
 */
#ifndef HP_MODELS_H
#define HP_MODELS_H

#include "hp/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_MODEL_NAME_MAX 32

/* A model request: family ("llama3", "mlp"), flavor, and overrides (0 = flavor default). */
typedef struct hp_model_spec {
    char family[HP_MODEL_NAME_MAX];
    char flavor[HP_MODEL_NAME_MAX];
    int64_t batch, seq; /* local batch and sequence length */
    int64_t dim, n_layers, n_heads, n_kv_heads, ffn_hidden, vocab;
    double norm_eps, rope_theta; /* 0 = default */
} hp_model_spec;

/* Parses "llama3:debugmodel", "llama3:8B", "mlp" (flavor defaults to the family's first);
 * the rest of spec is zeroed. Errors name the unknown family or flavor and list the known. */
hp_status hp_model_spec_parse(const char *text, hp_model_spec *spec, hp_err *err);

/* The fully resolved Llama-3 configuration. */
typedef struct hp_llama3_config {
    int64_t dim, n_layers, n_heads, n_kv_heads, ffn_hidden, vocab;
    int64_t batch, seq;
    double norm_eps, rope_theta;
} hp_llama3_config;

/* Fills cfg from spec (flavor defaults, then overrides) and checks it: dims positive,
 * dim % n_heads == 0, n_heads % n_kv_heads == 0, even head_dim, sizes within the IR's
 * limits. Errors name the field. */
hp_status hp_llama3_resolve(const hp_model_spec *spec, hp_llama3_config *cfg, hp_err *err);
hp_status hp_llama3_build(const hp_llama3_config *cfg, hp_graph **out, hp_err *err);

typedef struct hp_mlp_config {
    int64_t batch, in_dim, hidden, n_classes, n_layers; /* n_layers hidden layers */
} hp_mlp_config;
hp_status hp_mlp_resolve(const hp_model_spec *spec, hp_mlp_config *cfg, hp_err *err);
/* MLP classifier: x [B, in] f32 -> (mm + bias, relu) x n_layers -> logits -> mean CE. */
hp_status hp_mlp_build(const hp_mlp_config *cfg, hp_graph **out, hp_err *err);

/* Dispatch on spec->family: forward graph, or joint graph (forward + autodiff). */
hp_status hp_model_build(const hp_model_spec *spec, hp_graph **out, hp_err *err);
hp_status hp_model_build_joint(const hp_model_spec *spec, hp_graph **out, hp_err *err);

/* Training FLOPs per token, torchtitan's convention: 6 * (N - embedding params) + 12*L*d*T
 * (0 when the family has no such formula, e.g. mlp: then 6 * N). */
double hp_model_flops_per_token(const hp_model_spec *spec);

#ifdef __cplusplus
}
#endif
#endif

/* tests/graph/test_job.c — the job: torchtitan debug_model defaults, validation of every field
 * (each error names the field), placement words, round trips through bytes and files, and
 * hostile job files: truncated at every length, mutated and random bytes, bad fields set on
 * the message, oversized files, and allocation fault loops over unpack and pack.
 */
#define _GNU_SOURCE /* memmem */
#include "hp/build.h"
#include "hp/job.h"
#include "hp/models.h"
#include "hp/proto_io.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- fixtures -------------------------------------------------------------------------------- */

static hp_model_spec tiny_llama_spec(void) {
    hp_model_spec s;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &s, &err), HP_OK, "%s", err.msg);
    s.dim = 32, s.n_layers = 1, s.n_heads = 4, s.n_kv_heads = 2, s.ffn_hidden = 64;
    s.vocab = 64, s.batch = 8, s.seq = 8;
    return s;
}

/* A job on 4 ranks with a graph, marks, patterns, constraints and every setting changed from
 * its default, so that a round trip exercises every field. */
static hp_job *full_job(void) {
    hp_err err = {0};
    hp_job *job = hp_job_new();
    cr_assert_not_null(job);
    snprintf(job->name, sizeof job->name, "llama3-tiny.v2");
    job->model = tiny_llama_spec();
    cr_assert_eq(hp_model_build_joint(&job->model, &job->graph, &err), HP_OK, "%s", err.msg);

    hp_plan *p = &job->plan;
    p->n_mesh = 2;
    snprintf(p->mesh[0].name, sizeof p->mesh[0].name, "dp");
    p->mesh[0].size = 2;
    p->mesh[0].link = HP_LINK_INTER_NODE;
    snprintf(p->mesh[1].name, sizeof p->mesh[1].name, "tp");
    p->mesh[1].size = 2;
    p->mesh[1].link = HP_LINK_INTRA_NODE;
    p->mode = HP_PLAN_AUTO;
    p->reshard_after_forward = false;
    p->loss_parallel = true;
    p->param_dtype = HP_BF16; /* round-trips through plan.mixed_precision */
    p->mem_low = 0.1;
    p->mem_high = 0.6;
    cr_assert_eq(hp_job_add_fsdp_fqn(job, "tok_embeddings.weight", &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_job_add_fsdp_pattern(job, "layers.*", &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_job_add_fsdp_pattern(job, "*norm.weight", &err), HP_OK, "%s", err.msg);
    hp_placement w[2] = {{HP_PLACE_SHARD, 0, 0}, {HP_PLACE_SHARD, 1, 0}};
    cr_assert_eq(hp_job_add_constraint(job, "output.weight", 0, w, 2, &err), HP_OK);
    hp_placement loss[2] = {{HP_PLACE_PARTIAL, 0, HP_REDUCE_AVG}, {HP_PLACE_REPLICATE, 0, 0}};
    cr_assert_eq(hp_job_add_constraint(job, NULL, 0, loss, 2, &err), HP_OK);

    job->plan.ac_mode = HP_AC_SELECTIVE;
    job->plan.ac_every = 3;

    hp_pass_config *c = &job->passes;
    c->enable_overlap = false;
    c->bucket_bytes = 1 << 20;
    c->prefetch_depth = 2;
    c->n_dump = 2;
    snprintf(c->dump[0], sizeof c->dump[0], "fsdp");
    snprintf(c->dump[1], sizeof c->dump[1], "overlap");
    c->n_switches = 2;
    snprintf(c->switches[0].name, sizeof c->switches[0].name, "canonicalize");
    c->switches[0].enabled = false;
    snprintf(c->switches[1].name, sizeof c->switches[1].name, "bucketing");
    c->switches[1].enabled = true;

    hp_train_config *t = &job->train;
    t->steps = 1000;
    t->lr = 3e-4;
    t->min_lr_ratio = 0.1;
    t->warmup_steps = 100;
    t->decay = HP_DECAY_COSINE;
    t->weight_decay = 0.05;
    t->beta1 = 0.8;
    t->beta2 = 0.99;
    t->eps = 1e-6;
    t->grad_clip = 0.5;
    t->seed = UINT64_MAX - 7;
    t->log_interval = 10;
    t->checkpoint_interval = 500;
    snprintf(t->data_path, sizeof t->data_path, "/data/fineweb edu/train_*.bin");
    snprintf(t->init_from, sizeof t->init_from, "ckpt/step-500");
    t->local_batch = 4;   /* x dp 2: the tp ranks of a dp group share a batch */
    t->global_batch = 16; /* 2 micro-steps a step */
    t->seq = 8;
    t->eval_interval = 100;
    t->eval_steps = 7;
    snprintf(t->eval_data_path, sizeof t->eval_data_path, "/data/fineweb edu/val_*.bin");

    job->resources.world_size = 4;
    job->resources.device = HP_DEVICE_CUDA;
    job->resources.gpus_per_node = 2;
    job->resources.max_restarts = 3;
    cr_assert_eq(hp_job_validate(job, &err), HP_OK, "%s", err.msg);
    return job;
}

static void pack(const hp_job *job, uint8_t **data, size_t *len) {
    hp_err err = {0};
    cr_assert_eq(hp_job_pack(job, data, len, &err), HP_OK, "pack: %s", err.msg);
}

/* ---- defaults -------------------------------------------------------------------------------- */

Test(job, defaults_are_debug_model_toml) {
    hp_job job;
    hp_job_init_defaults(&job);
    cr_assert_null(job.graph);
    cr_assert_eq(job.train.steps, 10);
    cr_assert_eq(job.train.lr, 8e-4);
    cr_assert_eq(job.train.warmup_steps, 2);
    cr_assert_eq(job.train.decay, HP_DECAY_LINEAR);
    cr_assert_eq(job.train.weight_decay, 0.1);
    cr_assert_eq(job.train.beta1, 0.9);
    cr_assert_eq(job.train.beta2, 0.95);
    cr_assert_eq(job.train.eps, 1e-8);
    cr_assert_eq(job.train.grad_clip, 1.0);
    cr_assert_eq(job.train.local_batch, 8);
    cr_assert_eq(job.train.seq, 2048);
    cr_assert_eq(job.resources.world_size, 1);
    cr_assert_eq(job.plan.n_mesh, 1);
    cr_assert_eq(job.plan.mesh[0].size, 1);
    cr_assert_eq(job.plan.mode, HP_PLAN_FSDP);

    /* a job needs a graph or a model to build one from */
    hp_err err = {0};
    cr_assert_eq(hp_job_validate(&job, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "no model.family"), "%s", err.msg);
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &job.model, &err), HP_OK);
    cr_assert_eq(hp_job_validate(&job, &err), HP_OK, "%s", err.msg);
    hp_job_fini(&job);
}

/* ---- validation ------------------------------------------------------------------------------ */

typedef struct bad_case {
    const char *want; /* substring of the error */
    void (*edit)(hp_job *job);
} bad_case;

#define EDIT(name, body)                                                                           \
    static void name(hp_job *j) {                                                                  \
        body;                                                                                      \
    }
EDIT(e_name_empty, j->name[0] = 0)
EDIT(e_name_char, snprintf(j->name, sizeof j->name, "my job"))
EDIT(e_world_zero, j->resources.world_size = 0)
EDIT(e_world_big, j->resources.world_size = HP_MAX_WORLD + 1)
EDIT(e_device, j->resources.device = 7)
EDIT(e_gpus, j->resources.gpus_per_node = 0)
EDIT(e_restarts, j->resources.max_restarts = -1)
EDIT(e_family, snprintf(j->model.family, sizeof j->model.family, "gpt9"))
EDIT(e_model_dim, j->model.dim = -4)
EDIT(e_model_batch, j->model.batch = 3)
EDIT(e_mesh_product, j->plan.mesh[1].size = 3)
EDIT(e_mesh_dims, j->plan.n_mesh = 0)
EDIT(e_mesh_name, snprintf(j->plan.mesh[1].name, sizeof j->plan.mesh[1].name, "dp"))
EDIT(e_mesh_bw, j->plan.mesh[0].link.bandwidth = 0)
EDIT(e_mesh_lat, j->plan.mesh[1].link.latency = NAN)
EDIT(e_mode, j->plan.mode = 5)
EDIT(e_fqn, j->plan.fsdp_fqns[0][0] = 'X')
EDIT(e_budget, j->plan.mem_low = 0.7)
EDIT(e_mp_f16, j->plan.param_dtype = HP_F16)
EDIT(e_mp_int, j->plan.param_dtype = HP_I32)
EDIT(e_mp_reduce_bf16, j->plan.reduce_dtype = HP_BF16)
EDIT(e_loss_parallel_no_tp, snprintf(j->plan.mesh[1].name, sizeof j->plan.mesh[1].name, "mp"))
EDIT(e_constraint_fqn, j->plan.constraints[0].input_fqn[0] = 'X')
EDIT(e_constraint_out, j->plan.constraints[1].output = 99)
EDIT(e_constraint_n, j->plan.constraints[1].n_placements = 1)
EDIT(e_shard_dim, j->plan.constraints[0].placements[1].dim = 2)
EDIT(e_partial, j->plan.constraints[1].placements[0].reduce = HP_REDUCE_MAX)
EDIT(e_bucket, j->passes.bucket_bytes = -1)
EDIT(e_prefetch, j->passes.prefetch_depth = 1000)
EDIT(e_dump, snprintf(j->passes.dump[1], sizeof j->passes.dump[1], "over lap"))
EDIT(e_switch_dup, snprintf(j->passes.switches[1].name, HP_PASS_NAME_MAX, "canonicalize"))
EDIT(e_steps, j->train.steps = 0)
EDIT(e_lr_neg, j->train.lr = -1)
EDIT(e_lr_inf, j->train.lr = INFINITY)
EDIT(e_lr_nan, j->train.lr = NAN)
EDIT(e_min_lr, j->train.min_lr_ratio = 1.5)
EDIT(e_warmup, j->train.warmup_steps = 1001)
EDIT(e_decay, j->train.decay = 9)
EDIT(e_wd, j->train.weight_decay = -0.1)
EDIT(e_beta1, j->train.beta1 = 1.0)
EDIT(e_beta2, j->train.beta2 = -0.5)
EDIT(e_eps, j->train.eps = 0)
EDIT(e_clip, j->train.grad_clip = -1)
EDIT(e_log, j->train.log_interval = -1)
EDIT(e_ckpt, j->train.checkpoint_interval = -5)
EDIT(e_path, j->train.data_path[3] = '\n')
EDIT(e_local, j->train.local_batch = 0)
EDIT(e_seq, j->train.seq = -1)
EDIT(e_global, j->train.global_batch = 3)
EDIT(e_global_accum, j->train.global_batch = (int64_t)8 << 20)
EDIT(e_model_seq, j->train.seq = 16)
EDIT(e_eval_interval, j->train.eval_interval = -2)
EDIT(e_eval_no_data, j->train.eval_interval = 10; j->train.eval_data_path[0] = 0)
EDIT(e_eval_steps, j->train.eval_interval = 10; j->train.eval_steps = 0;
     snprintf(j->train.eval_data_path, sizeof j->train.eval_data_path, "val.bin"))
EDIT(e_eval_path, j->train.eval_interval = 10; j->train.eval_steps = 4;
     snprintf(j->train.eval_data_path, sizeof j->train.eval_data_path, "v\tal.bin"))
/* what hpctl new writes: model.batch/seq 0, so only the graph's data inputs can disagree */
EDIT(e_graph_seq, j->model.seq = j->model.batch = 0; j->train.seq = 7)
EDIT(e_graph_batch, j->model.seq = j->model.batch = 0; j->train.local_batch = 3;
     j->train.global_batch = 0)
EDIT(e_ac_mode, j->plan.ac_mode = (hp_ac_mode)7)
EDIT(e_ac_every, j->plan.ac_every = 0)
EDIT(e_ac_every_none, j->plan.ac_mode = HP_AC_NONE; j->plan.ac_every = 2)
EDIT(e_switch_unknown, snprintf(j->passes.switches[1].name, HP_PASS_NAME_MAX, "fsdpp"))

static const bad_case bad_cases[] = {
    {"name: must not be empty", e_name_empty},
    {"name: 'my job' has a bad character", e_name_char},
    {"resources.world_size: 0 must be in [1, 65536]", e_world_zero},
    {"resources.world_size: 65537", e_world_big},
    {"resources.device: 7", e_device},
    {"resources.gpus_per_node: 0 must be in [1, 1024]", e_gpus},
    {"resources.max_restarts: -1", e_restarts},
    {"model: unknown", e_family},
    {"model.dim: -4", e_model_dim},
    {"model.batch: 3 (the global batch) differs", e_model_batch},
    {"plan.mesh: the dims' sizes multiply to 6, resources.world_size is 4", e_mesh_product},
    {"plan.mesh: 0 dims", e_mesh_dims},
    {"plan.mesh[1].name: 'dp' repeats plan.mesh[0]", e_mesh_name},
    {"plan.mesh[0].link.bandwidth: 0", e_mesh_bw},
    {"plan.mesh[1].link.latency: nan", e_mesh_lat},
    {"plan.mode: 5", e_mode},
    {"plan.fsdp_fqns[0]: 'Xok_embeddings.weight' names no parameter or module", e_fqn},
    {"plan.param_memory_budget: (0.7, 0.6)", e_budget},
    {"plan.loss_parallel: the mesh has no 'tp' dim", e_loss_parallel_no_tp},
    {"plan.mixed_precision.param_dtype: f16 is not supported", e_mp_f16},
    {"plan.mixed_precision.param_dtype: i32 is not a floating dtype", e_mp_int},
    {"plan.mixed_precision.reduce_dtype: bf16 is not supported; gradients are reduced in f32",
     e_mp_reduce_bf16},
    {"plan.constraints[0]: no graph input 'Xutput.weight'", e_constraint_fqn},
    {"plan.constraints[1]: output 99 outside", e_constraint_out},
    {"plan.constraints[1]: 1 placements, the mesh has 2 dims", e_constraint_n},
    {"plan.constraints[0]: placement 1: Shard(2) outside rank 2", e_shard_dim},
    {"plan.constraints[1]: placement 0: Partial takes sum or avg", e_partial},
    {"passes.bucket_bytes: -1", e_bucket},
    {"passes.prefetch_depth: 1000", e_prefetch},
    {"passes.dump[1]: 'over lap' has a bad character", e_dump},
    {"passes.passes[1].name: 'canonicalize' repeats passes.passes[0]", e_switch_dup},
    {"train.steps: 0 must be in [1,", e_steps},
    {"train.lr: -1 must be finite and in (0, 1000]", e_lr_neg},
    {"train.lr: inf", e_lr_inf},
    {"train.lr: nan", e_lr_nan},
    {"train.min_lr_ratio: 1.5", e_min_lr},
    {"train.warmup_steps: 1001 must be in [0, 1000]", e_warmup},
    {"train.decay: 9", e_decay},
    {"train.weight_decay: -0.1", e_wd},
    {"train.beta1: 1 must be finite and in [0, 1)", e_beta1},
    {"train.beta2: -0.5", e_beta2},
    {"train.eps: 0 must be finite and in (0, 1]", e_eps},
    {"train.grad_clip: -1", e_clip},
    {"train.log_interval: -1", e_log},
    {"train.checkpoint_interval: -5", e_ckpt},
    {"train.data_path: '/da\\x0aa/fineweb", e_path},
    {"train.local_batch: 0", e_local},
    {"train.seq: -1", e_seq},
    {"train.global_batch: 3 is not a multiple of local_batch x the mesh's dp size = 8", e_global},
    {"train.global_batch: 8388608 is 1048576 micro-steps of 8 sequences; at most 65536",
     e_global_accum},
    {"model.seq: 8 differs from train.seq 16", e_model_seq},
    {"train.eval_interval: -2", e_eval_interval},
    {"train.eval_data_path: evaluating every 10 steps needs held-out data", e_eval_no_data},
    {"train.eval_steps: 0 must be in [1, 1000000]", e_eval_steps},
    {"train.eval_data_path: 'v\\x09al.bin'", e_eval_path},
    {"train.seq: 7, but the graph's data input 'tokens' is [8, 8] (seq 8)", e_graph_seq},
    {"train.local_batch: 3 x 2 data-parallel ranks = 6, but the graph's data input 'tokens' is "
     "[8, 8] (global batch 8)",
     e_graph_batch},
    {"plan.activation_checkpoint.mode: 7 is not none, full, selective or auto", e_ac_mode},
    {"plan.activation_checkpoint.every: 0 is not in [1, 65536]", e_ac_every},
    {"plan.activation_checkpoint.every: 2 with mode none checkpoints nothing", e_ac_every_none},
    {"passes.passes[1].name: 'fsdpp' names no pass (the passes: dce, canonicalize, fuse_attention, "
     "activation_checkpoint, loss_parallel, spmd, fsdp, mixed_precision, fuse_cross_entropy, "
     "fuse_swiglu, overlap, "
     "bucketing)",
     e_switch_unknown},
};

Test(job, every_field_is_validated) {
    hp_job *base = full_job();
    uint8_t *data;
    size_t len;
    pack(base, &data, &len);
    for (size_t i = 0; i < HP_ARRAY_LEN(bad_cases); i++) {
        hp_job *job = NULL;
        hp_err err = {0};
        cr_assert_eq(hp_job_unpack(data, len, &job, &err), HP_OK, "%s", err.msg);
        bad_cases[i].edit(job);
        hp_status s = hp_job_validate(job, &err);
        cr_assert_neq(s, HP_OK, "case %zu (%s) passed validation", i, bad_cases[i].want);
        cr_assert(strstr(err.msg, bad_cases[i].want), "case %zu: error '%s' lacks '%s'", i, err.msg,
                  bad_cases[i].want);

        /* a writer may pack a bad draft; a reader must refuse it with the same message */
        uint8_t *bad;
        size_t bad_len;
        hp_job *back = NULL;
        hp_err err2 = {0};
        if (hp_job_pack(job, &bad, &bad_len, &err2) == HP_OK) {
            cr_assert_neq(hp_job_unpack(bad, bad_len, &back, &err2), HP_OK, "case %zu", i);
            cr_assert_null(back);
            cr_assert(err2.msg[0]);
            hp_free(bad);
        }
        hp_job_free(job);
    }
    hp_free(data);
    hp_job_free(base);
}

Test(job, fsdp_mode_global_batch) {
    hp_job *job = full_job();
    hp_err err = {0};
    job->plan.mode = HP_PLAN_FSDP;
    job->train.global_batch = 4; /* local 4 x dp 2 = 8 */
    cr_assert_eq(hp_job_validate(job, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "train.global_batch: 4 is not a multiple of local_batch x the "
                              "mesh's dp size = 8"),
              "%s", err.msg);
    job->train.global_batch = 8;
    cr_assert_eq(hp_job_validate(job, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_job_grad_accum(job), 1);
    job->train.global_batch = 0;
    cr_assert_eq(hp_job_grad_accum(job), 1);
    /* a whole number of micro-steps: gradient accumulation */
    job->train.global_batch = 24;
    cr_assert_eq(hp_job_validate(job, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_job_grad_accum(job), 3);
    hp_job_free(job);
}

/* A pattern matching no parameter is the FSDP pass's warning, not a validation error; an exact
 * FQN that names no parameter stays an error. */
Test(job, unmatched_pattern_is_not_an_error) {
    hp_job *job = full_job();
    hp_err err = {0};
    job->plan.fsdp_patterns[0][0] = 'X';
    cr_assert_eq(hp_job_validate(job, &err), HP_OK, "%s", err.msg);
    job->plan.fsdp_patterns[0][0] = 0;
    cr_assert_eq(hp_job_validate(job, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "plan.fsdp_patterns[0]: empty"), "%s", err.msg);
    hp_job_free(job);
}

Test(job, placement_words) {
    const char *good[] = {"Replicate",    "Shard(0)",     "Shard(7)",
                          "Partial(sum)", "Partial(avg)", "Partial(max)"};
    for (size_t i = 0; i < HP_ARRAY_LEN(good); i++) {
        hp_placement p;
        char buf[32];
        hp_err err = {0};
        cr_assert_eq(hp_placement_parse(good[i], &p, &err), HP_OK, "%s: %s", good[i], err.msg);
        cr_assert_str_eq(hp_placement_str(&p, buf, sizeof buf), good[i]);
    }
    const char *bad[] = {"",          "Shard",   "Shard()",      "Shard(8)",  "Shard(-1)",
                         "Shard(1))", "Shard(1", "Partial(min)", "replicate", "Shard(99999999999)"};
    for (size_t i = 0; i < HP_ARRAY_LEN(bad); i++) {
        hp_placement p;
        hp_err err = {0};
        cr_assert_eq(hp_placement_parse(bad[i], &p, &err), HP_PARSE, "'%s' parsed", bad[i]);
        cr_assert(strstr(err.msg, "placement '"), "%s", err.msg);
    }
}

Test(job, fqn_patterns) {
    cr_assert(hp_fqn_match("layers.*", "layers.3.attention.wq.weight"));
    cr_assert(hp_fqn_match("*norm.weight", "layers.0.ffn_norm.weight"));
    cr_assert(hp_fqn_match("*norm.weight", "norm.weight"));
    cr_assert(hp_fqn_match("layers.?.*.w?.weight", "layers.7.feed_forward.w3.weight"));
    cr_assert(hp_fqn_match("*", ""));
    cr_assert(hp_fqn_match("tok_embeddings.weight", "tok_embeddings.weight"));
    cr_assert_not(hp_fqn_match("layers.*", "norm.weight"));
    cr_assert_not(hp_fqn_match("layers.?.*", "layers.12.attention.wq.weight"));
    cr_assert_not(hp_fqn_match("*.bias", "output.weight"));
    cr_assert_not(hp_fqn_match("", "x"));
    /* a pattern that makes a backtracking matcher take exponential time */
    char fqn[HP_MAX_STR], pat[HP_MAX_STR];
    memset(fqn, 'a', sizeof fqn - 1);
    fqn[sizeof fqn - 1] = 0;
    for (size_t i = 0; i + 2 < sizeof pat; i += 2) pat[i] = '*', pat[i + 1] = 'a';
    pat[sizeof pat - 2] = 'b';
    pat[sizeof pat - 1] = 0;
    cr_assert_not(hp_fqn_match(pat, fqn));
}

/* ---- round trips ----------------------------------------------------------------------------- */

Test(job, round_trip_bytes) {
    hp_job *job = full_job();
    uint8_t *data, *again;
    size_t len, len2;
    hp_job *back = NULL;
    hp_err err = {0};
    pack(job, &data, &len);
    cr_assert_eq(hp_job_unpack(data, len, &back, &err), HP_OK, "%s", err.msg);
    cr_assert(hp_job_eq(job, back));
    pack(back, &again, &len2);
    cr_assert(len == len2 && !memcmp(data, again, len), "re-encoding differs");

    back->train.seed ^= 1; /* hp_job_eq sees a one-bit difference */
    cr_assert_not(hp_job_eq(job, back));
    hp_free(again);
    hp_free(data);
    hp_job_free(back);
    hp_job_free(job);
}

Test(job, round_trip_without_graph) {
    hp_job job;
    hp_err err = {0};
    hp_job_init_defaults(&job);
    job.model = tiny_llama_spec();
    job.train.local_batch = 8; /* world 1: the whole global batch */
    job.train.seq = 8;
    uint8_t *data;
    size_t len;
    pack(&job, &data, &len);
    hp_job *back = NULL;
    cr_assert_eq(hp_job_unpack(data, len, &back, &err), HP_OK, "%s", err.msg);
    cr_assert_null(back->graph);
    cr_assert(hp_job_eq(&job, back));
    hp_free(data);
    hp_job_free(back);
    hp_job_fini(&job);
}

static char *temp_path(const char *name) {
    static char path[256];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/hp_test_job_%d_%s", dir ? dir : "/tmp", (int)getpid(), name);
    return path;
}

Test(job, round_trip_file) {
    hp_job *job = full_job();
    hp_job *back = NULL;
    hp_err err = {0};
    const char *path = temp_path("ok.pb");
    cr_assert_eq(hp_job_write_file(path, job, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_job_read_file(path, &back, &err), HP_OK, "%s", err.msg);
    cr_assert(hp_job_eq(job, back));
    hp_job_free(back);

    /* a bad file: the error starts with the path */
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs("not a job", f);
    fclose(f);
    cr_assert_neq(hp_job_read_file(path, &back, &err), HP_OK);
    cr_assert_null(back);
    cr_assert(!strncmp(err.msg, path, strlen(path)), "%s", err.msg);
    unlink(path);

    cr_assert_eq(hp_job_read_file(temp_path("missing.pb"), &back, &err), HP_IO);
    cr_assert(strstr(err.msg, "missing.pb"), "%s", err.msg);
    hp_job_free(job);
}

/* A file over the limit is refused before it is read (a sparse file: no disk used). */
Test(job, oversized_file) {
    const char *path = temp_path("big.pb");
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(ftruncate(fileno(f), (off_t)HP_JOB_FILE_MAX + 1), 0);
    fclose(f);
    hp_job *job = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_job_read_file(path, &job, &err), HP_LIMIT, "%s", err.msg);
    cr_assert(strstr(err.msg, "big.pb"), "%s", err.msg);
    unlink(path);
    static const uint8_t byte = 0;
    cr_assert_eq(hp_job_unpack(&byte, HP_JOB_FILE_MAX + 1, &job, &err), HP_LIMIT);
    cr_assert_null(job);
}

/* ---- hostile messages ------------------------------------------------------------------------ */

/* Exports a valid job, lets `edit` break the message, and checks that unpacking its bytes
 * fails with an error containing `want`. */
static void expect_msg_error(void (*edit)(Hp__V1__Job *m), hp_status want_status,
                             const char *want) {
    hp_job *job = full_job();
    hp_arena arena;
    hp_arena_init(&arena);
    Hp__V1__Job *m;
    hp_err err = {0};
    cr_assert_eq(hp_job_export(job, &arena, &m, &err), HP_OK);
    edit(m);
    size_t len = hp__v1__job__get_packed_size(m);
    uint8_t *buf = hp_malloc(len ? len : 1);
    hp__v1__job__pack(m, buf);
    hp_job *back = NULL;
    hp_status s = hp_job_unpack(buf, len, &back, &err);
    cr_assert_null(back);
    cr_assert_eq(s, want_status, "%s: got %s: %s", want, hp_status_str(s), err.msg);
    cr_assert(strstr(err.msg, want), "error '%s' lacks '%s'", err.msg, want);
    hp_free(buf);
    hp_arena_fini(&arena);
    hp_job_free(job);
}

static char long_str[HP_JOB_PATH_MAX + 8];
static const char *make_long(void) {
    memset(long_str, 'a', sizeof long_str - 1);
    long_str[sizeof long_str - 1] = 0;
    return long_str;
}

#define MSG_EDIT(name, body)                                                                       \
    static void name(Hp__V1__Job *m) {                                                             \
        body;                                                                                      \
    }
MSG_EDIT(m_version0, m->format_version = 0)
MSG_EDIT(m_version9, m->format_version = 9)
MSG_EDIT(m_name_long, m->name = (char *)make_long())
MSG_EDIT(m_no_plan, m->plan = NULL)
MSG_EDIT(m_no_train, m->train = NULL)
MSG_EDIT(m_no_resources, m->resources = NULL)
MSG_EDIT(m_no_passes, m->passes = NULL)
MSG_EDIT(m_mode_unset, m->plan->mode = 0)
MSG_EDIT(m_mode_unknown, m->plan->mode = 77)
MSG_EDIT(m_decay, m->train->decay = 0)
MSG_EDIT(m_device, m->resources->device = 3)
MSG_EDIT(m_path_long, m->train->data_path = (char *)make_long())
MSG_EDIT(m_family_long, m->model->family = (char *)make_long())
MSG_EDIT(m_mesh_many, m->plan->n_mesh = HP_MESH_MAX_DIMS + 1)
MSG_EDIT(m_mesh_link, m->plan->mesh[1]->link = NULL)
MSG_EDIT(m_mesh_name, m->plan->mesh[0]->name = "d p")
MSG_EDIT(m_dump_many, m->passes->n_dump = HP_PASS_MAX + 1)
MSG_EDIT(m_switch_long, m->passes->passes[0]->name = (char *)make_long())
MSG_EDIT(m_fqns_many, m->plan->n_fsdp_fqns = HP_PLAN_MAX_ITEMS + 1)
MSG_EDIT(m_constraints_many, m->plan->n_constraints = (size_t)1 << 40)
MSG_EDIT(m_fqn_bad, m->plan->fsdp_fqns[0] = "tok\tembeddings")
MSG_EDIT(m_target, m->plan->constraints[1]->target_case = 0)
MSG_EDIT(m_place_kind, m->plan->constraints[0]->placements[1]->kind = 0)
MSG_EDIT(m_place_reduce, m->plan->constraints[1]->placements[0]->reduce = 0)
MSG_EDIT(m_places_many, m->plan->constraints[1]->n_placements = HP_MESH_MAX_DIMS + 1)
MSG_EDIT(m_graph_op, m->graph->nodes[20]->op = "matmul_fast")
MSG_EDIT(m_graph_ref, m->graph->nodes[20]->inputs[0]->node = 4000)
MSG_EDIT(m_world, m->resources->world_size = -2)
MSG_EDIT(m_ac_unset, m->plan->activation_checkpoint->mode = 0)
MSG_EDIT(m_ac_unknown, m->plan->activation_checkpoint->mode = 9)
MSG_EDIT(m_ac_every, m->plan->activation_checkpoint->every = -4)

Test(job_bad, hostile_fields) {
    expect_msg_error(m_version0, HP_INVALID, "job: format_version is 0");
    expect_msg_error(m_version9, HP_UNSUPPORTED, "job: format_version 9 is newer");
    expect_msg_error(m_name_long, HP_LIMIT, "name: 'aaaa");
    expect_msg_error(m_no_plan, HP_INVALID, "plan: missing");
    expect_msg_error(m_no_train, HP_INVALID, "train: missing");
    expect_msg_error(m_no_resources, HP_INVALID, "resources: missing");
    expect_msg_error(m_no_passes, HP_INVALID, "passes: missing");
    expect_msg_error(m_mode_unset, HP_INVALID, "plan.mode: unset");
    expect_msg_error(m_mode_unknown, HP_INVALID, "plan.mode: unknown value 77");
    expect_msg_error(m_decay, HP_INVALID, "train.decay: unset");
    expect_msg_error(m_device, HP_INVALID, "resources.device: unknown value 3");
    expect_msg_error(m_path_long, HP_LIMIT, "train.data_path:");
    expect_msg_error(m_family_long, HP_LIMIT, "model.family:");
    expect_msg_error(m_mesh_link, HP_INVALID, "plan.mesh[1].link: missing");
    expect_msg_error(m_mesh_name, HP_INVALID, "plan.mesh[0].name: 'd p' has a bad character");
    expect_msg_error(m_switch_long, HP_LIMIT, "passes.passes[0].name:");
    expect_msg_error(m_fqn_bad, HP_INVALID, "plan.fsdp_fqns[0]: 'tok\\x09embeddings'");
    expect_msg_error(m_target, HP_INVALID, "plan.constraints[1]: no target");
    expect_msg_error(m_place_kind, HP_INVALID, "plan.constraints[0].placements[1]: unset");
    expect_msg_error(m_place_reduce, HP_INVALID, "plan.constraints[1].placements[0]: unset");
    expect_msg_error(m_graph_op, HP_NOT_FOUND, "node 20: unknown op 'matmul_fast'");
    expect_msg_error(m_graph_ref, HP_INVALID, "node 20");
    expect_msg_error(m_world, HP_INVALID, "resources.world_size: -2");
    expect_msg_error(m_ac_unset, HP_INVALID, "plan.activation_checkpoint.mode: unset");
    expect_msg_error(m_ac_unknown, HP_INVALID, "plan.activation_checkpoint.mode: unknown value 9");
    expect_msg_error(m_ac_every, HP_INVALID, "plan.activation_checkpoint.every: -4");
}

/* A string field patched on the wire: the message is built with `sentinel` in a string, packed,
 * and the sentinel's bytes replaced by `with` (same length) before unpacking. */
static void expect_wire_error(void (*edit)(Hp__V1__Job *), const char *sentinel, const char *with,
                              const char *want) {
    hp_job *job = full_job();
    hp_arena arena;
    hp_arena_init(&arena);
    Hp__V1__Job *m;
    hp_err err = {0};
    cr_assert_eq(hp_job_export(job, &arena, &m, &err), HP_OK);
    edit(m);
    size_t len = hp__v1__job__get_packed_size(m);
    uint8_t *buf = hp_malloc(len ? len : 1);
    hp__v1__job__pack(m, buf);
    uint8_t *at = memmem(buf, len, sentinel, strlen(sentinel));
    cr_assert(at, "sentinel not on the wire");
    memcpy(at, with, strlen(sentinel));
    hp_job *back = NULL;
    hp_status s = hp_job_unpack(buf, len, &back, &err);
    cr_assert_null(back);
    cr_expect_eq(s, HP_INVALID, "%s: got %s: %s", want, hp_status_str(s), err.msg);
    cr_expect(strstr(err.msg, want), "error '%s' lacks '%s'", err.msg, want);
    hp_free(buf);
    hp_arena_fini(&arena);
    hp_job_free(job);
}

MSG_EDIT(w_name, m->name = "j-000001QZQZjunk")
MSG_EDIT(w_op, m->graph->nodes[20]->op = "mmQZQZevil")
MSG_EDIT(w_fqn, m->plan->fsdp_fqns[0] = "tokQZQZ_embeddings")
MSG_EDIT(w_path, m->train->data_path = "/dataQZQZ")
MSG_EDIT(w_switch, m->passes->passes[0]->name = "fsdpQZQZ")

/* protobuf-c hands a `string` over as a NUL-terminated char *: "mm\0evil" would read as "mm".
 * Every string field of a job (graph included) is checked on the wire: no NUL, valid UTF-8. */
Test(job_bad, nul_and_invalid_utf8_on_the_wire) {
    const char nul[] = "\0ZQZ";
    expect_wire_error(w_name, "QZQZ", nul, "job: Job.name: string has a NUL byte at byte 8");
    expect_wire_error(w_op, "QZQZ", nul, "job: Node.op: string has a NUL byte at byte 2");
    expect_wire_error(w_fqn, "QZQZ", nul, "job: ParallelPlan.fsdp_fqns: string has a NUL byte");
    expect_wire_error(w_switch, "QZQZ", nul, "job: PassSwitch.name: string has a NUL byte");
    expect_wire_error(w_path, "QZQZ", "\xc0\xafZQ",
                      "job: TrainConfig.data_path: string has a byte that is not valid UTF-8 at "
                      "byte 5");
    expect_wire_error(w_name, "QZQZ", "\xed\xa0\x80Z", "Job.name: string has a byte that is not");
}

/* Counts over a fixed array's size, at message level (no bytes needed to claim them). */
Test(job_bad, oversized_counts) {
    void (*edits[])(Hp__V1__Job *) = {m_mesh_many, m_dump_many, m_places_many, m_fqns_many,
                                      m_constraints_many};
    const char *want[] = {"plan.mesh: 5 entries, over the limit of 4",
                          "passes.dump: 33 entries, over the limit of 32",
                          "plan.constraints[1].placements: 5 entries, over the limit of 4",
                          "plan.fsdp_fqns: 65537 entries, over the limit of 65536",
                          "plan.constraints: 1099511627776 entries"};
    for (size_t i = 0; i < HP_ARRAY_LEN(edits); i++) {
        hp_job *job = full_job(), *back = NULL;
        hp_arena arena;
        hp_arena_init(&arena);
        Hp__V1__Job *m;
        hp_err err = {0};
        cr_assert_eq(hp_job_export(job, &arena, &m, &err), HP_OK);
        edits[i](m);
        cr_assert_eq(hp_job_import(m, &back, &err), HP_LIMIT, "%s", err.msg);
        cr_assert_null(back);
        cr_assert(strstr(err.msg, want[i]), "'%s' lacks '%s'", err.msg, want[i]);
        hp_arena_fini(&arena);
        hp_job_free(job);
    }
}

/* Every field of a job follows its graph, so a job cut anywhere loses a required part. */
Test(job_bad, truncated_at_every_length) {
    hp_job *job = full_job();
    uint8_t *data;
    size_t len;
    pack(job, &data, &len);
    for (size_t n = 0; n < len; n++) {
        hp_job *back = NULL;
        hp_err err = {0};
        hp_status s = hp_job_unpack(data, n, &back, &err);
        cr_assert_neq(s, HP_OK, "a %zu-byte prefix of %zu decoded", n, len);
        cr_assert_null(back);
        cr_assert(err.msg[0], "prefix %zu: no message", n);
    }
    hp_free(data);
    hp_job_free(job);
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

Test(job_bad, random_and_mutated_bytes) {
    hp_job *job = full_job();
    uint8_t *data;
    size_t len;
    pack(job, &data, &len);
    uint8_t *buf = hp_malloc(len);
    uint64_t seed = 99;
    int ok = 0, bad = 0;
    for (int it = 0; it < 4000; it++) {
        size_t n;
        if (it % 2) { /* random bytes */
            n = rng_next(&seed) % 600;
            for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rng_next(&seed);
        } else { /* a valid job with a few bytes changed */
            n = len;
            memcpy(buf, data, len);
            for (int k = 0; k < 1 + it % 3; k++)
                buf[rng_next(&seed) % len] = (uint8_t)rng_next(&seed);
        }
        hp_job *back = NULL;
        hp_err err = {0};
        if (hp_job_unpack(buf, n, &back, &err) == HP_OK) {
            cr_assert_eq(hp_job_validate(back, &err), HP_OK, "accepted an invalid job: %s",
                         err.msg);
            hp_job_free(back);
            ok++;
        } else {
            cr_assert_null(back);
            cr_assert(err.msg[0]);
            bad++;
        }
    }
    cr_log_info("job bytes: %d accepted, %d refused", ok, bad);
    hp_free(buf);
    hp_free(data);
    hp_job_free(job);
}

/* ---- allocation faults ----------------------------------------------------------------------- */

Test(job_faults, unpack_fault_loop) {
    hp_job *job = full_job();
    uint8_t *data;
    size_t len;
    pack(job, &data, &len);
    long n = 0;
    for (;; n++) {
        hp_job *back = NULL;
        hp_err err = {0};
        hp_alloc_fail_at(n);
        hp_status s = hp_job_unpack(data, len, &back, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            cr_assert(hp_job_eq(job, back));
            hp_job_free(back);
            break;
        }
        cr_assert_eq(s, HP_NOMEM, "fail at %ld: %s (%s)", n, hp_status_str(s), err.msg);
        cr_assert_null(back);
        cr_assert_lt(n, 1000000);
    }
    cr_log_info("job unpack: %ld allocation points", n);
    hp_free(data);
    hp_job_free(job);
}

Test(job_faults, pack_and_helpers_fault_loop) {
    hp_job *job = full_job();
    for (long n = 0;; n++) {
        uint8_t *data = NULL;
        size_t len = 0;
        hp_err err = {0};
        hp_alloc_fail_at(n);
        hp_status s = hp_job_pack(job, &data, &len, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            hp_free(data);
            break;
        }
        cr_assert_eq(s, HP_NOMEM, "%s", err.msg);
        cr_assert_null(data);
    }
    hp_placement r = {HP_PLACE_REPLICATE, 0, 0};
    for (long n = 0; n < 3; n++) {
        hp_err err = {0};
        int before = job->plan.n_fsdp_patterns, cbefore = job->plan.n_constraints;
        hp_alloc_fail_at(n);
        hp_status a = hp_job_add_fsdp_pattern(job, "layers.0.*", &err);
        hp_alloc_fail_at(n);
        hp_status b = hp_job_add_constraint(job, "norm.weight", 0, &r, 1, &err);
        hp_alloc_fail_at(-1);
        cr_assert(a == HP_OK || (a == HP_NOMEM && job->plan.n_fsdp_patterns == before));
        cr_assert(b == HP_OK || (b == HP_NOMEM && job->plan.n_constraints == cbefore));
    }
    hp_job_free(job);
}

/* HyperParallel's fsdp_mark names a module: a '.'-boundary prefix of FQNs marks all of them. */
Test(job, fsdp_names_are_parameters_or_modules) {
    hp_graph *g = hp_graph_new();
    const char *fqns[] = {"tok_embeddings.weight", "layers.1.w.weight", "layers.1.w.bias",
                          "layers.10.w.weight",    "layers.1x.weight",  "output.weight"};
    for (size_t i = 0; i < HP_ARRAY_LEN(fqns); i++)
        hp_build_placeholder(g, HP_INPUT_PARAM, fqns[i], hp_type_make(HP_F32, 1, (int64_t[]){4}),
                             NULL);
    cr_assert(!hp_graph_failed(g));
    struct {
        const char *name;
        const char *want; /* marked parameters as 0/1 per fqn */
    } cases[] = {{"tok_embeddings", "100000"}, {"tok_embeddings.weight", "100000"},
                 {"layers.1", "011000"},       {"layers", "011110"},
                 {"layers.1.w", "011000"},     {"output.weight", "000001"}};
    for (size_t c = 0; c < HP_ARRAY_LEN(cases); c++) {
        bool marked[6] = {0};
        char *names[1] = {(char *)cases[c].name};
        hp_err err = {0};
        cr_assert_eq(hp_plan_mark_names(g, names, 1, marked, &err), HP_OK, "%s", err.msg);
        for (int i = 0; i < 6; i++)
            cr_expect_eq(marked[i], cases[c].want[i] == '1', "%s marks %s: %d", cases[c].name,
                         fqns[i], marked[i]);
    }
    const char *bad[] = {"layer", "layers.", "tok_embeddings.weight.x", "", "layers.1.w.weigh"};
    for (size_t c = 0; c < HP_ARRAY_LEN(bad); c++) {
        bool marked[6] = {0};
        char *names[2] = {"output", (char *)bad[c]};
        hp_err err = {0};
        cr_assert_eq(hp_plan_mark_names(g, names, 2, marked, &err), HP_INVALID, "'%s'", bad[c]);
        cr_expect(strstr(err.msg, "plan.fsdp_fqns[1]: '") &&
                      strstr(err.msg, "names no parameter or module"),
                  "%s", err.msg);
    }
    hp_graph_free(g);
}

/* A parameter (or buffer) with an empty FQN is refused, in a job file as in a built graph. */
Test(job_bad, empty_parameter_fqn) {
    hp_job *job = full_job();
    hp_arena arena;
    hp_arena_init(&arena);
    Hp__V1__Job *m;
    hp_err err = {0};
    cr_assert_eq(hp_job_export(job, &arena, &m, &err), HP_OK);
    Hp__V1__Node *n0 = m->graph->nodes[0];
    bool found = false;
    for (size_t i = 0; i < n0->n_attrs; i++)
        if (!strcmp(n0->attrs[i]->name, "fqn")) {
            n0->attrs[i]->str = "";
            found = true;
        }
    cr_assert(found, "node 0 has no fqn attribute");
    size_t len = hp__v1__job__get_packed_size(m);
    uint8_t *buf = hp_malloc(len);
    hp__v1__job__pack(m, buf);
    hp_job *back = NULL;
    cr_expect_eq(hp_job_unpack(buf, len, &back, &err), HP_INVALID, "%s", err.msg);
    cr_expect(strstr(err.msg, "node 0") && strstr(err.msg, "a parameter needs a non-empty fqn"),
              "%s", err.msg);
    cr_expect_null(back);
    hp_free(buf);
    hp_arena_fini(&arena);
    hp_job_free(job);

    hp_graph *g = hp_graph_new();
    hp_build_placeholder(g, HP_INPUT_PARAM, "", hp_type_make(HP_F32, 1, (int64_t[]){4}), NULL);
    cr_expect(hp_graph_failed(g));
    cr_expect(strstr(g->err.msg, "non-empty fqn"), "%s", g->err.msg);
    hp_graph_free(g);
}

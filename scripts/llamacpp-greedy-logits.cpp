// Greedy decoding with llama.cpp's library, printing every step's logits: the reference for
// thicket's tiny-model checks against llama.cpp (see scripts/rope-scaling-reference.py).
//
//   llamacpp-greedy-logits [--no-flash-attn] MODEL.gguf N_CTX STEPS TOKEN...
//
// Feeds the prompt tokens as one batch, then each greedy token on its own, with f32 K/V and
// two threads; prints one JSON object per line: {"step": i, "token": t, "logits": [...]},
// `logits` being those that chose `token` (the prompt's last row for step 0). Flash attention
// is left to llama.cpp (on for the CPU), which casts f32 K and V to f16 before attending;
// `--no-flash-attn` turns it off, so attention runs in f32 like the rest.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    const bool no_flash_attn = argc > 1 && std::strcmp(argv[1], "--no-flash-attn") == 0;
    if (no_flash_attn) {
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s [--no-flash-attn] MODEL N_CTX STEPS TOKEN...\n", argv[0]);
        return 2;
    }
    const int n_ctx = std::atoi(argv[2]);
    const int steps = std::atoi(argv[3]);
    std::vector<llama_token> prompt;
    for (int i = 4; i < argc; i++) {
        prompt.push_back(std::atoi(argv[i]));
    }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    if (no_flash_attn) {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        std::fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<llama_token> next = prompt;
    for (int step = 0; step < steps; step++) {
        llama_batch batch = llama_batch_get_one(next.data(), (int) next.size());
        if (llama_decode(ctx, batch) != 0) {
            std::fprintf(stderr, "decode failed at step %d\n", step);
            return 1;
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int i = 1; i < n_vocab; i++) {
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        std::printf("{\"step\": %d, \"token\": %d, \"logits\": [", step, best);
        for (int i = 0; i < n_vocab; i++) {
            std::printf(i ? ", %.7g" : "%.7g", logits[i]);
        }
        std::printf("]}\n");
        next.assign(1, best);
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

"""Names the dead-code check (vulture, run by scripts/test.sh) may not count as dead: each is
used where vulture cannot see it. A name that is truly unused is removed, not listed here.

    python -m vulture edgespec scripts examples tests/dead_code_allowlist.py --min-confidence 60
"""
# ruff: noqa: B018, F821
_ = object()

# llama.cpp's parameter structs: fields set in Python, read in C
_.use_extra_bufts
_.tensor_buft_overrides  # llama_model_params: the weights kept on the repacked kernels
_._devices              # kept alive: llama.cpp holds a pointer into it
_.n_ubatch
_.n_seq_max
_.kv_unified
_.n_threads_batch
_.no_perf
_.pooling_type
_.cb_eval_user_data
_.flash_attn_type
_.allow_requantize
_.nthread
_.vocab_only
# arguments that a C, prompt-toolkit or signal callback signature requires
user_data
line_number
wrap_count
frame
signum
# called by the machinery around them, not by name
__getattr__             # the package's lazy imports (PEP 562)
_close_open_engines     # atexit
_newline                # a prompt-toolkit key binding (decorator)
intercepted_binops      # jinja2's sandbox reads it
_.unsafe_undefined      # jinja2's sandbox calls it
_.eos_token_id          # read by llguidance's tokenizer protocol
_.bos_token_id
_.special_token_ids
_.collect               # prometheus_client calls a collector's collect() at each scrape
# the public API (docs/api.md): used by applications, not by edgespec itself
_.chat
_.agenerate
_.parsed_arguments
_.neutral
forget                  # preflight: an app that swapped llama.cpp's build checks again
_.transcript_text       # examples/tk_chat.py: its test reads the window's transcript
# scripts/client_matrix.py: pydantic fields the clients fill, http.server's hooks
country
population
protocol_version
_.log_message
_.close_connection
do_DELETE
do_GET
do_HEAD
do_PATCH
do_POST
do_PUT
_.daemon_threads
_.DEFAULT_REQUEST_TIMEOUT
_.n_rs_seq              # backend/model.py: a llama_context_params field ctypes reads

"""llama-cpp-python without llama.cpp's extra (repacked: AMX, interleaved) weight buffers, for
the bench scripts that load GGUF files with it (llamacpp_decode.py --no-extra-buffers,
llamacpp_logprobs.py by default): on the AMX machine of 2026-12-07 llama-cpp-python 0.3.36
crashed (SIGSEGV) on Q4_0, Q4_1 and IQ4_XS files with them."""
import llama_cpp


def without_extra_buffers():
    """Every Llama() made after this loads with use_extra_bufts off. Llama() takes no such
    argument: the default model parameters it starts from are changed instead."""
    default_model_params = llama_cpp.llama_model_default_params

    def model_params_without_extra_buffers():
        params = default_model_params()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama.llama_cpp.llama_model_default_params = model_params_without_extra_buffers

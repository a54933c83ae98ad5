class Qwen3NextForCausalLM:
    pass


EntryClass = Qwen3NextForCausalLM

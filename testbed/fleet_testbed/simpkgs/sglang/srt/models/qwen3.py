class Qwen3ForCausalLM:
    pass


EntryClass = Qwen3ForCausalLM

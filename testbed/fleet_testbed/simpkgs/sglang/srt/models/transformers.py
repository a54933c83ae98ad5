class TransformersForCausalLM:
    pass


EntryClass = [TransformersForCausalLM]

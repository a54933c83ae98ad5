class Qwen3_5ForConditionalGeneration:
    pass


class Qwen3_5MoeForConditionalGeneration:
    pass


EntryClass = [Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration]

class XLMRobertaModel:
    pass


class XLMRobertaForSequenceClassification:
    pass


EntryClass = [XLMRobertaModel, XLMRobertaForSequenceClassification]

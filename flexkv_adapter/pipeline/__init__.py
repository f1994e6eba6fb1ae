"""``adapt()``: the stages that turn a located pool into FlexKV-ready views, in order."""

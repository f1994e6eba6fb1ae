"""``KVEventCollector`` (used only with DYNAMO_USE_FLEXKV=1)."""


class KVEventCollector:
    def take_events(self):
        return []

    def close(self):
        pass

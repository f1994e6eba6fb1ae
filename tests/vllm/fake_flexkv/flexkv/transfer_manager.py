"""``TransferManagerOnRemote`` (multi-node only)."""


class TransferManagerOnRemote:
    @staticmethod
    def create_process(master_host, master_ports):
        raise RuntimeError("multi-node FlexKV is not part of the stand-in")

"""recflash.torchrec_ext — TorchRec integration: sharder for SSD-offloaded tables, DRAM/SSD planner, TorchRec modules."""

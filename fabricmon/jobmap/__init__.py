"""Which job holds which GPUs of a node, for jobs that never report a step (DESIGN "Jobs, decoys and cost").

Schedulers know: Slurm's prolog and epilog (``slurm_hooks``) write and remove one small file per job in
the agent's job directory (``store``); on Kubernetes the agent asks the kubelet's PodResources API
(``podresources``).  The agent's ``jobs`` source exports both as ``fabricmon_job_gpu_info`` and streams
them; the aggregator lists every job on a faulty component, measured or not.
"""

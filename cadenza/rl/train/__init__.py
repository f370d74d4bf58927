"""The trainer's distributed side: the policy sharded on the dual mesh (:mod:`.sharding`)."""

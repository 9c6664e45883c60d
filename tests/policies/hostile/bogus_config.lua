-- A config serve refuses at start-up: policy.reload must refuse it too.
return { config = { kv_dtype = "bogus" } }

-- wrk script (bench/load.py's "(varied)" targets): every request a random
-- calculator input — model, method, sequence length, micro-batch, vendor, and three times in
-- ten training tokens (bench/calculator_varied.py's generator) — so the render memo is
-- almost never hit and the cold path is what is measured. The path prefix and the model
-- names come from the environment (bench/load.py sets them from sizing.presets).
local prefix = os.getenv("VARIED_PATH") or "/size/"
local models = {}
for name in string.gmatch(os.getenv("VARIED_MODELS") or "llama-2-13b", "[^,]+") do
  models[#models + 1] = name
end
local methods = {"full", "full-8bit", "lora", "qlora"}
local seqs = {256, 512, 1024, 2048, 3072, 4096, 8192}
local batches = {1, 2, 4, 8, 16}
local vendors = {"cuda", "any"}

local function pick(list) return list[math.random(#list)] end

function setup(thread)
  thread:set("seed", math.random(1, 2^30))
end

function init(args)
  math.randomseed(seed or os.time())
end

local tokens = {10000000, 20000000, 100000000}

function request()
  local path = string.format("%s?model=%s&method=%s&seq=%d&batch=%d&vendor=%s", prefix, pick(models),
                             pick(methods), pick(seqs), pick(batches), pick(vendors))
  -- as bench/calculator_varied.py: three in ten ask for the run time and cost too
  if math.random() < 0.3 then
    path = path .. string.format("&tokens=%d", pick(tokens))
  end
  return wrk.format("GET", path)
end

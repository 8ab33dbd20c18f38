-- wrk script (bench/load.py's "(varied)" targets, issue 31): every request a random
-- calculator input — model, method, sequence length, micro-batch, vendor — so the render
-- memo is almost never hit and the cold path is what is measured. The path prefix and the
-- model names come from the environment (bench/load.py sets them from sizing.presets).
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

function request()
  local path = string.format("%s?model=%s&method=%s&seq=%d&batch=%d&vendor=%s", prefix, pick(models),
                             pick(methods), pick(seqs), pick(batches), pick(vendors))
  return wrk.format("GET", path)
end

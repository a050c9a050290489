<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE TS>
<TS version="2.1" language="es" sourcelanguage="en">
<context>
    <name>Attach</name>
    <message>
        <source>the server&apos;s GPU: {source}</source>
        <translation>la GPU del servidor: {source}</translation>
    </message>
    <message>
        <source>{server} at {url}</source>
        <translation>{server} en {url}</translation>
    </message>
    <message>
        <source>server</source>
        <translation>servidor</translation>
    </message>
    <message>
        <source>{server} · {message} · retrying</source>
        <translation>{server} · {message} · reintentando</translation>
    </message>
    <message>
        <source>running {running} · waiting {waiting}</source>
        <translation>en curso {running} · en espera {waiting}</translation>
    </message>
    <message>
        <source>KV cache {pct}% used</source>
        <translation>caché KV ocupada al {pct}%</translation>
    </message>
    <message>
        <source>engines</source>
        <translation>motores</translation>
    </message>
    <message>
        <source>speculative acceptance {pct}%</source>
        <translation>aceptación especulativa {pct}%</translation>
    </message>
    <message>
        <source>attached to a server: its settings are its own</source>
        <translation>conectado a un servidor: sus ajustes son los suyos</translation>
    </message>
    <message>
        <source>Attach to a server</source>
        <translation>Conectar a un servidor</translation>
    </message>
    <message>
        <source>http://host:port of a vLLM, SGLang or llama.cpp server</source>
        <translation>http://host:puerto de un servidor vLLM, SGLang o llama.cpp</translation>
    </message>
    <message>
        <source>NVML when the server runs here</source>
        <translation>NVML si el servidor corre en esta máquina</translation>
    </message>
    <message>
        <source>only for a server started with --api-key</source>
        <translation>solo para un servidor arrancado con --api-key</translation>
    </message>
    <message>
        <source>Server</source>
        <translation>Servidor</translation>
    </message>
    <message>
        <source>Its GPU (for MBU, MFU)</source>
        <translation>Su GPU (para MBU, MFU)</translation>
    </message>
    <message>
        <source>API key</source>
        <translation>Clave de API</translation>
    </message>
    <message>
        <source>Attach to server…</source>
        <translation>Conectar a servidor…</translation>
    </message>
    <message>
        <source>show a running vLLM, SGLang or llama.cpp server&apos;s figures and chat with it</source>
        <translation>muestra las cifras de un servidor vLLM, SGLang o llama.cpp en marcha y chatea con él</translation>
    </message>
    <message>
        <source>Detach</source>
        <translation>Desconectar</translation>
    </message>
    <message>
        <source>the server&apos;s GPU: unknown — {note}</source>
        <translation>la GPU del servidor: desconocida — {note}</translation>
    </message>
    <message>
        <source>figures: the server&apos;s /metrics — its counters, and its own estimates of bytes and FLOPs where it publishes them</source>
        <translation>cifras: el /metrics del servidor — sus contadores y sus propias estimaciones de bytes y FLOPs, donde las publica</translation>
    </message>
    <message>
        <source>Serving: the server&apos;s batch, queue and latencies</source>
        <translation>Servicio: lote, cola y latencias del servidor</translation>
    </message>
    <message>
        <source>attached to {url}</source>
        <translation>conectado a {url}</translation>
    </message>
    <message>
        <source>attached to {url}: replies stream from its /v1/chat/completions; the plots are its /metrics, one point per scrape · {note}</source>
        <translation>conectado a {url}: las respuestas llegan en streaming desde su /v1/chat/completions; las gráficas son su /metrics, un punto por lectura · {note}</translation>
    </message>
    <message>
        <source>connecting to {url}…</source>
        <translation>conectando con {url}…</translation>
    </message>
    <message>
        <source>detached: the local model again</source>
        <translation>desconectado: de nuevo el modelo local</translation>
    </message>
    <message>
        <source>detached</source>
        <translation>desconectado</translation>
    </message>
    <message>
        <source>{n} tokens ({reason})</source>
        <translation>{n} tokens ({reason})</translation>
    </message>
    <message>
        <source>{tps} tok/s (this reply, from the stream)</source>
        <translation>{tps} tok/s (esta respuesta, según el stream)</translation>
    </message>
    <message>
        <source>server: {tps} tok/s generated, every request, since it was sent (its counters)</source>
        <translation>servidor: {tps} tok/s generados, todas las peticiones, desde que se envió (sus contadores)</translation>
    </message>
    <message>
        <source>the server stopped answering: {message} (retrying)</source>
        <translation>el servidor dejó de responder: {message} (reintentando)</translation>
    </message>
    <message>
        <source>the server answers again (it restarted)</source>
        <translation>el servidor vuelve a responder (se reinició)</translation>
    </message>
    <message>
        <source>the server answers again</source>
        <translation>el servidor vuelve a responder</translation>
    </message>
</context>
<context>
    <name>Chat</name>
    <message>
        <source>Ask something… (Enter sends, Esc stops)</source>
        <translation>Pregunta algo… (Intro envía, Esc detiene)</translation>
    </message>
    <message>
        <source>Chat</source>
        <translation>Chat</translation>
    </message>
    <message>
        <source>no model loaded</source>
        <translation>ningún modelo cargado</translation>
    </message>
    <message>
        <source>Send</source>
        <translation>Enviar</translation>
    </message>
    <message>
        <source>Stop  (Esc)</source>
        <translation>Detener  (Esc)</translation>
    </message>
    <message>
        <source>New chat  (Ctrl+N)</source>
        <translation>Chat nuevo  (Ctrl+N)</translation>
    </message>
    <message>
        <source>the model is replying… (Esc stops)</source>
        <translation>el modelo está respondiendo… (Esc detiene)</translation>
    </message>
    <message>
        <source>waiting for the model…</source>
        <translation>esperando al modelo…</translation>
    </message>
    <message>
        <source>You</source>
        <translation>Tú</translation>
    </message>
    <message>
        <source>Model</source>
        <translation>Modelo</translation>
    </message>
</context>
<context>
    <name>Controls</name>
    <message>
        <source>Precision</source>
        <translation>Precisión</translation>
    </message>
    <message>
        <source>bytes per weight read every step: fp32 = 4, bf16/fp16 = 2</source>
        <translation>bytes por peso leídos en cada paso: fp32 = 4, bf16/fp16 = 2</translation>
    </message>
    <message>
        <source>KV cache</source>
        <translation>Caché KV</translation>
    </message>
    <message>
        <source>off: every step recomputes the whole context (tokens/s falls as the context grows)</source>
        <translation>desactivada: cada paso vuelve a calcular todo el contexto (los tokens/s caen a medida que crece el contexto)</translation>
    </message>
    <message>
        <source>Weights</source>
        <translation>Pesos</translation>
    </message>
    <message>
        <source>weight-only quantisation: INT8 = 1 byte per weight (+ a scale per row), INT4 = half a byte (+ a scale and minimum per group); activations stay in the precision above</source>
        <translation>cuantización solo de pesos: INT8 = 1 byte por peso (+ una escala por fila), INT4 = medio byte (+ una escala y un mínimo por grupo); las activaciones siguen en la precisión de arriba</translation>
    </message>
    <message>
        <source>INT4 group</source>
        <translation>Grupo INT4</translation>
    </message>
    <message>
        <source>INT4: inputs sharing one scale and minimum (smaller = more accurate, more scale bytes)</source>
        <translation>INT4: entradas que comparten una escala y un mínimo (más pequeño = más preciso, más bytes de escala)</translation>
    </message>
    <message>
        <source>Attention</source>
        <translation>Atención</translation>
    </message>
    <message>
        <source>Naive</source>
        <translation>Ingenua</translation>
    </message>
    <message>
        <source>naive writes the score matrix to memory and reads it back; flash keeps it on chip</source>
        <translation>la ingenua escribe la matriz de puntuaciones en memoria y la vuelve a leer; flash la mantiene en el chip</translation>
    </message>
    <message>
        <source>KV layout</source>
        <translation>Disposición KV</translation>
    </message>
    <message>
        <source>Contig.</source>
        <translation>Contig.</translation>
    </message>
    <message>
        <source>Paged</source>
        <translation>Paginada</translation>
    </message>
    <message>
        <source>Off</source>
        <translation>No</translation>
    </message>
    <message>
        <source>contiguous reserves the whole context per sequence; paged takes blocks on demand; off recomputes the context every step</source>
        <translation>contigua reserva el contexto entero por secuencia; paginada toma bloques según hace falta; no vuelve a calcular el contexto en cada paso</translation>
    </message>
    <message>
        <source>Users</source>
        <translation>Usuarios</translation>
    </message>
    <message>
        <source>simulated users sending requests beside your chat: the engine batches every running request into one forward, so the weights are read once per step for all of them</source>
        <translation>usuarios simulados que envían peticiones junto a tu chat: el motor agrupa todas las peticiones en curso en una sola pasada, así que los pesos se leen una vez por paso para todas</translation>
    </message>
    <message>
        <source>Batching</source>
        <translation>Lotes</translation>
    </message>
    <message>
        <source>Contin.</source>
        <translation>Contin.</translation>
    </message>
    <message>
        <source>Static</source>
        <translation>Estático</translation>
    </message>
    <message>
        <source>continuous: requests join and leave the batch at every step; static: a batch forms, runs until its longest member ends, then the next forms</source>
        <translation>continuo: las peticiones entran y salen del lote en cada paso; estático: se forma un lote, corre hasta que acaba su miembro más largo y luego se forma el siguiente</translation>
    </message>
    <message>
        <source>Speculate</source>
        <translation>Especular</translation>
    </message>
    <message>
        <source>Lookup</source>
        <translation>Búsqueda</translation>
    </message>
    <message>
        <source>Draft</source>
        <translation>Borrador</translation>
    </message>
    <message>
        <source>speculative decoding: guess k tokens cheaply, check them all in one step of the model (one read of the weights for up to k + 1 tokens; the reply is exactly what it would have been). Lookup copies what followed the last match of the text&apos;s final words in the conversation; Draft asks the model itself at the draft weights below</source>
        <translation>decodificación especulativa: adivina k tokens de forma barata y los comprueba todos en un paso del modelo (una lectura de los pesos para hasta k + 1 tokens; la respuesta es exactamente la que habría sido). Búsqueda copia lo que siguió a la última aparición de las palabras finales del texto en la conversación; Borrador pregunta al propio modelo con los pesos de borrador de abajo</translation>
    </message>
    <message>
        <source>Draft k</source>
        <translation>k del borrador</translation>
    </message>
    <message>
        <source>tokens guessed per speculative step</source>
        <translation>tokens adivinados por paso especulativo</translation>
    </message>
    <message>
        <source>Draft weights</source>
        <translation>Pesos del borrador</translation>
    </message>
    <message>
        <source>the draft model&apos;s weights (the model itself, quantised: fewer bytes per guess)</source>
        <translation>los pesos del modelo borrador (el propio modelo, cuantizado: menos bytes por propuesta)</translation>
    </message>
    <message>
        <source>Captured</source>
        <translation>Capturado</translation>
    </message>
    <message>
        <source>the overhead lever: decode steps replayed from a captured CUDA graph instead of hundreds of kernel launches (small models are launch-bound on a GPU); off: every step eager</source>
        <translation>la palanca de la sobrecarga: los pasos de decode se reproducen desde un grafo CUDA capturado en lugar de cientos de lanzamientos de kernels (los modelos pequeños están limitados por los lanzamientos en una GPU); desactivado: cada paso en modo eager</translation>
    </message>
    <message>
        <source>Max tokens</source>
        <translation>Máx. tokens</translation>
    </message>
    <message>
        <source>longest reply, in tokens</source>
        <translation>respuesta más larga, en tokens</translation>
    </message>
    <message>
        <source>Temperature</source>
        <translation>Temperatura</translation>
    </message>
    <message>
        <source>0 = greedy (always the likeliest token)</source>
        <translation>0 = voraz (siempre el token más probable)</translation>
    </message>
    <message>
        <source>Top-p</source>
        <translation>Top-p</translation>
    </message>
    <message>
        <source>sample from the smallest set of tokens holding this mass</source>
        <translation>muestrea del menor conjunto de tokens que reúne esta masa</translation>
    </message>
    <message>
        <source>weights</source>
        <translation>pesos</translation>
    </message>
    <message>
        <source>perplexity</source>
        <translation>perplejidad</translation>
    </message>
    <message>
        <source>top-1 = fp</source>
        <translation>top-1 = fp</translation>
    </message>
    <message>
        <source>More…</source>
        <translation>Más…</translation>
    </message>
    <message>
        <source>the numbers (max tokens, temperature, top-p, draft k) and the window&apos;s buttons; every switch keeps its key</source>
        <translation>los números (máx. tokens, temperatura, top-p, k del borrador) y los botones de la ventana; cada interruptor conserva su tecla</translation>
    </message>
    <message>
        <source>&lt;b&gt;Quality&lt;/b&gt; on {n} tokens of evaluation text</source>
        <translation>&lt;b&gt;Calidad&lt;/b&gt; en {n} tokens de texto de evaluación</translation>
    </message>
    <message>
        <source>at most {n} here: {why}</source>
        <translation>como mucho {n} aquí: {why}</translation>
    </message>
    <message>
        <source>asked for: waiting for the engine</source>
        <translation>pedido: esperando al motor</translation>
    </message>
    <message>
        <source>ON</source>
        <translation>SÍ</translation>
    </message>
    <message>
        <source>OFF</source>
        <translation>NO</translation>
    </message>
</context>
<context>
    <name>HardwareStrip</name>
    <message>
        <source>spec</source>
        <translation>ficha</translation>
    </message>
    <message>
        <source>measured</source>
        <translation>medido</translation>
    </message>
    <message>
        <source>{gbs} GB/s (last-level cache, {mib} MiB)</source>
        <translation>{gbs} GB/s (caché de último nivel, {mib} MiB)</translation>
    </message>
    <message>
        <source>{kind} dots {rate} ({origin})</source>
        <translation>productos {kind} {rate} ({origin})</translation>
    </message>
    <message>
        <source>unknown</source>
        <translation>desconocido</translation>
    </message>
    <message>
        <source>peak bandwidth: {}</source>
        <translation>ancho de banda pico: {}</translation>
    </message>
    <message>
        <source>peak compute: {}</source>
        <translation>cómputo pico: {}</translation>
    </message>
    <message>
        <source>measuring the device…</source>
        <translation>midiendo el dispositivo…</translation>
    </message>
    <message>
        <source>weights {size} (model)</source>
        <translation>pesos {size} (modelo)</translation>
    </message>
    <message>
        <source>memory used {used} of {total} (NVML)</source>
        <translation>memoria usada {used} de {total} (NVML)</translation>
    </message>
    <message>
        <source>DRAM bandwidth {pct}% of peak (NVML GPM)</source>
        <translation>ancho de banda DRAM al {pct}% del pico (NVML GPM)</translation>
    </message>
    <message>
        <source>memory busy {pct}% of time (NVML)</source>
        <translation>memoria ocupada el {pct}% del tiempo (NVML)</translation>
    </message>
    <message>
        <source>SM busy {pct}% (NVML)</source>
        <translation>SM ocupados {pct}% (NVML)</translation>
    </message>
    <message>
        <source>engine process {used} of {total} RAM (OS)</source>
        <translation>proceso del motor {used} de {total} de RAM (SO)</translation>
    </message>
    <message>
        <source>no NVML here: throughput and utilisation are modelled (cost model ÷ measured step time)</source>
        <translation>aquí no hay NVML: el caudal y la utilización son modelados (modelo de coste ÷ tiempo de paso medido)</translation>
    </message>
</context>
<context>
    <name>KvPanel</name>
    <message>
        <source>KV cache</source>
        <translation>Caché KV</translation>
    </message>
    <message>
        <source>off: nothing is stored, every step recomputes the whole context</source>
        <translation>desactivada: no se guarda nada, cada paso vuelve a calcular todo el contexto</translation>
    </message>
    <message>
        <source>empty: nothing cached yet</source>
        <translation>vacía: aún no hay nada en caché</translation>
    </message>
    <message>
        <source>KV cache · {layout} · {cells} cells of {tokens} tokens</source>
        <translation>Caché KV · {layout} · {cells} celdas de {tokens} tokens</translation>
    </message>
    <message>
        <source>{used} hold tokens of {reserved} reserved ({pct}% reserved but empty)</source>
        <translation>{used} con tokens de {reserved} reservados ({pct}% reservado pero vacío)</translation>
    </message>
    <message>
        <source>blocks {used} in use / {free} free of {pool}</source>
        <translation>bloques {used} en uso / {free} libres de {pool}</translation>
    </message>
    <message>
        <source>{n} more {probe}-token sequences fit</source>
        <translation>caben {n} secuencias más de {probe} tokens</translation>
    </message>
    <message>
        <source>each sequence reserves {per} positions up front: 0 more fit (paged, this memory holds {paged} {probe}-token sequences)</source>
        <translation>cada secuencia reserva {per} posiciones de antemano: no cabe ninguna más (paginada, esta memoria alberga {paged} secuencias de {probe} tokens)</translation>
    </message>
    <message>
        <source>seq {seq}: {tokens} tokens in {cells} cells</source>
        <translation>sec. {seq}: {tokens} tokens en {cells} celdas</translation>
    </message>
    <message>
        <source>▨ reserved, empty · □ free</source>
        <translation>▨ reservada, vacía · □ libre</translation>
    </message>
</context>
<context>
    <name>ModelPicker</name>
    <message>
        <source>model</source>
        <translation>modelo</translation>
    </message>
    <message>
        <source>architecture</source>
        <translation>arquitectura</translation>
    </message>
    <message>
        <source>parameters</source>
        <translation>parámetros</translation>
    </message>
    <message>
        <source>file</source>
        <translation>archivo</translation>
    </message>
    <message>
        <source>type</source>
        <translation>tipo</translation>
    </message>
    <message>
        <source>fits</source>
        <translation>cabe</translation>
    </message>
    <message>
        <source>ceiling</source>
        <translation>techo</translation>
    </message>
    <message>
        <source>from</source>
        <translation>origen</translation>
    </message>
    <message>
        <source>Open a model</source>
        <translation>Abrir un modelo</translation>
    </message>
    <message>
        <source>A model on this machine</source>
        <translation>Un modelo de esta máquina</translation>
    </message>
    <message>
        <source>Look again</source>
        <translation>Buscar otra vez</translation>
    </message>
    <message>
        <source>Add a folder…</source>
        <translation>Añadir una carpeta…</translation>
    </message>
    <message>
        <source>Default model (SmolLM2-135M-Instruct, GGUF)</source>
        <translation>Modelo por defecto (SmolLM2-135M-Instruct, GGUF)</translation>
    </message>
    <message>
        <source>GGUF file</source>
        <translation>Archivo GGUF</translation>
    </message>
    <message>
        <source>Hugging Face model folder (config.json + safetensors)</source>
        <translation>Carpeta de modelo de Hugging Face (config.json + safetensors)</translation>
    </message>
    <message>
        <source>Synthetic shape — random weights: the text is noise, the speed is real</source>
        <translation>Forma sintética — pesos aleatorios: el texto es ruido, la velocidad es real</translation>
    </message>
    <message>
        <source>path to a .gguf file or a model folder</source>
        <translation>ruta a un archivo .gguf o a una carpeta de modelo</translation>
    </message>
    <message>
        <source>Browse…</source>
        <translation>Examinar…</translation>
    </message>
    <message>
        <source>automatic (a GPU if there is one)</source>
        <translation>automático (una GPU si la hay)</translation>
    </message>
    <message>
        <source>CUDA GPU</source>
        <translation>GPU CUDA</translation>
    </message>
    <message>
        <source>Path</source>
        <translation>Ruta</translation>
    </message>
    <message>
        <source>Shape</source>
        <translation>Forma</translation>
    </message>
    <message>
        <source>Device</source>
        <translation>Dispositivo</translation>
    </message>
    <message>
        <source>The current chat ends when a new model loads; a model that fails to load leaves the current one in place. A quantised file (Q4_K_M…) runs at the precision chosen (fp32, bf16): the fit and ceiling columns are for that.</source>
        <translation>El chat actual termina cuando se carga un modelo nuevo; si un modelo no se puede cargar, el actual sigue en su sitio. Un archivo cuantizado (Q4_K_M…) se ejecuta con la precisión elegida (fp32, bf16): las columnas «cabe» y «techo» se refieren a ella.</translation>
    </message>
    <message>
        <source>looking for models on this machine…</source>
        <translation>buscando modelos en esta máquina…</translation>
    </message>
    <message>
        <source>could not list the models: {error}</source>
        <translation>no se pudieron listar los modelos: {error}</translation>
    </message>
    <message>
        <source>cannot run: {reason}</source>
        <translation>no se puede ejecutar: {reason}</translation>
    </message>
    <message>
        <source>{n} found ({usable} can run) in the HF cache, LM Studio, llama.cpp, Ollama and your folders; hover a greyed row for why it cannot run</source>
        <translation>{n} encontrados ({usable} se pueden ejecutar) en la caché de HF, LM Studio, llama.cpp, Ollama y tus carpetas; pasa el ratón por una fila en gris para ver por qué no se puede ejecutar</translation>
    </message>
    <message>
        <source>no models found in the HF cache, LM Studio, llama.cpp, Ollama and your folders</source>
        <translation>no se encontraron modelos en la caché de HF, LM Studio, llama.cpp, Ollama ni en tus carpetas</translation>
    </message>
    <message>
        <source>A folder with models</source>
        <translation>Una carpeta con modelos</translation>
    </message>
    <message>
        <source>HF model folder</source>
        <translation>Carpeta de modelo de HF</translation>
    </message>
    <message>
        <source>GGUF model</source>
        <translation>Modelo GGUF</translation>
    </message>
    <message>
        <source>GGUF models (*.gguf);;All files (*)</source>
        <translation>Modelos GGUF (*.gguf);;Todos los archivos (*)</translation>
    </message>
</context>
<context>
    <name>Plots</name>
    <message>
        <source>server&apos;s estimate</source>
        <translation>estimación del servidor</translation>
    </message>
    <message>
        <source>a server&apos;s /metrics has no per-step times: each reply&apos;s TTFT and tok/s come from its stream, in the chat</source>
        <translation>el /metrics de un servidor no tiene tiempos por paso: el TTFT y los tok/s de cada respuesta salen de su stream, en el chat</translation>
    </message>
    <message>
        <source>scrape (every {s} s)</source>
        <translation>lectura (cada {s} s)</translation>
    </message>
    <message>
        <source>step</source>
        <translation>paso</translation>
    </message>
    <message>
        <source>Compute</source>
        <translation>Cómputo</translation>
    </message>
    <message>
        <source>% of peak FLOP/s</source>
        <translation>% FLOP/s pico</translation>
    </message>
    <message>
        <source>SM busy (NVML)</source>
        <translation>SM ocupados (NVML)</translation>
    </message>
    <message>
        <source>tensor cores busy (NVML GPM)</source>
        <translation>tensor cores ocupados (NVML GPM)</translation>
    </message>
    <message>
        <source>{dots} dots + {rest}</source>
        <translation>productos {dots} + {rest}</translation>
    </message>
    <message>
        <source>measured</source>
        <translation>medido</translation>
    </message>
    <message>
        <source>spec</source>
        <translation>ficha</translation>
    </message>
    <message>
        <source>peak {value} {unit} {dtype} ({origin})</source>
        <translation>pico {value} {unit} {dtype} ({origin})</translation>
    </message>
    <message>
        <source>{rate} (model) · MFU {mfu}%</source>
        <translation>{rate} (modelo) · MFU {mfu}%</translation>
    </message>
    <message>
        <source>Memory traffic</source>
        <translation>Tráfico de memoria</translation>
    </message>
    <message>
        <source>DRAM bandwidth (NVML GPM)</source>
        <translation>ancho de banda DRAM (NVML GPM)</translation>
    </message>
    <message>
        <source>measured peak {gbs} GB/s</source>
        <translation>pico medido {gbs} GB/s</translation>
    </message>
    <message>
        <source>spec peak {gbs} GB/s (datasheet)</source>
        <translation>pico de ficha {gbs} GB/s (hoja de datos)</translation>
    </message>
    <message>
        <source>last-level cache {gbs} GB/s (steps up to {mib} MiB)</source>
        <translation>caché de último nivel {gbs} GB/s (pasos de hasta {mib} MiB)</translation>
    </message>
    <message>
        <source>cache {gbs} GB/s</source>
        <translation>caché {gbs} GB/s</translation>
    </message>
    <message>
        <source>{gbs} GB/s (model) · {pct}% of the cache roof</source>
        <translation>{gbs} GB/s (modelo) · {pct}% del techo de la caché</translation>
    </message>
    <message>
        <source>{gbs} GB/s (model) · {pct}% of {roof} GB/s</source>
        <translation>{gbs} GB/s (modelo) · {pct}% de {roof} GB/s</translation>
    </message>
    <message>
        <source>{gbs} GB/s (model) · {pct}% of peak</source>
        <translation>{gbs} GB/s (modelo) · {pct}% del pico</translation>
    </message>
    <message>
        <source>Roofline</source>
        <translation>Roofline</translation>
    </message>
    <message>
        <source>FLOP/s (log)</source>
        <translation>FLOP/s (log)</translation>
    </message>
    <message>
        <source>arithmetic intensity, FLOP/B (log)</source>
        <translation>intensidad aritmética, FLOP/B (log)</translation>
    </message>
    <message>
        <source>roofline</source>
        <translation>roofline</translation>
    </message>
    <message>
        <source>this step</source>
        <translation>este paso</translation>
    </message>
    <message>
        <source>last prefill</source>
        <translation>último prefill</translation>
    </message>
    <message>
        <source>{unit} (log)</source>
        <translation>{unit} (log)</translation>
    </message>
    <message>
        <source>ridge {ai} FLOP/B</source>
        <translation>punto de cresta {ai} FLOP/B</translation>
    </message>
    <message>
        <source>prefill</source>
        <translation>prefill</translation>
    </message>
    <message>
        <source>decode</source>
        <translation>decodificación</translation>
    </message>
    <message>
        <source>{phase} {ai} FLOP/B: {bound}</source>
        <translation>{phase} {ai} FLOP/B: {bound}</translation>
    </message>
    <message>
        <source>more plots on the number keys: {plots} (0: this grid)</source>
        <translation>más gráficas con las teclas numéricas: {plots} (0: esta rejilla)</translation>
    </message>
    <message>
        <source>side panel</source>
        <translation>panel lateral</translation>
    </message>
    <message>
        <source>generation {tps} tok/s (server&apos;s counters)</source>
        <translation>generación {tps} tok/s (contadores del servidor)</translation>
    </message>
    <message>
        <source>ceiling {tps} ({source})</source>
        <translation>techo {tps} ({source})</translation>
    </message>
    <message>
        <source>{gbs} GB/s per GPU ({source})</source>
        <translation>{gbs} GB/s por GPU ({source})</translation>
    </message>
    <message>
        <source>{rate} per GPU ({source})</source>
        <translation>{rate} por GPU ({source})</translation>
    </message>
    <message>
        <source>compute-bound</source>
        <translation>limitado por cómputo</translation>
    </message>
    <message>
        <source>memory-bound</source>
        <translation>limitado por memoria</translation>
    </message>
    <message>
        <source>Phase timeline</source>
        <translation>Fases en el tiempo</translation>
    </message>
    <message>
        <source>step time (ms)</source>
        <translation>ms por paso</translation>
    </message>
    <message>
        <source>time since send (s)</source>
        <translation>tiempo desde el envío (s)</translation>
    </message>
    <message>
        <source>draft (the draft model&apos;s guesses)</source>
        <translation>borrador (las propuestas del modelo borrador)</translation>
    </message>
    <message>
        <source>verify (the target checks k + 1 tokens)</source>
        <translation>verificación (el modelo objetivo comprueba k + 1 tokens)</translation>
    </message>
    <message>
        <source>decode · {settings}</source>
        <translation>decodificación · {settings}</translation>
    </message>
    <message>
        <source>{ms} ms/token</source>
        <translation>{ms} ms/token</translation>
    </message>
    <message>
        <source>{ms} ms/token (median)</source>
        <translation>{ms} ms/token (mediana)</translation>
    </message>
    <message>
        <source>overhead {ms} ms a step beyond its bytes at peak</source>
        <translation>sobrecarga {ms} ms/paso sobre sus bytes al pico</translation>
    </message>
    <message>
        <source>Tokens/s</source>
        <translation>Tokens/s</translation>
    </message>
    <message>
        <source>tokens/s (log)</source>
        <translation>tokens/s (log)</translation>
    </message>
    <message>
        <source>ceiling = peak BW ÷ bytes/token</source>
        <translation>techo = BW pico ÷ bytes/token</translation>
    </message>
    <message>
        <source>ceiling, compute-bound</source>
        <translation>techo, limitado por cómputo</translation>
    </message>
    <message>
        <source>decode {tps} tok/s</source>
        <translation>decodificación {tps} tok/s</translation>
    </message>
    <message>
        <source>ceiling {tps} (model)</source>
        <translation>techo {tps} (modelo)</translation>
    </message>
    <message>
        <source>{tokens} tokens per weight read</source>
        <translation>{tokens} tokens por lectura de pesos</translation>
    </message>
    <message>
        <source>Speculation: guesses kept</source>
        <translation>Especulación: aceptación</translation>
    </message>
    <message>
        <source>guesses kept (%)</source>
        <translation>% aceptado</translation>
    </message>
    <message>
        <source>one verify step</source>
        <translation>un paso de verificación</translation>
    </message>
    <message>
        <source>mean of the last {n}</source>
        <translation>media de los últimos {n}</translation>
    </message>
    <message>
        <source>{pct}% kept · {tokens} tokens per weight read (k = {k})</source>
        <translation>{pct}% aceptadas · {tokens} tokens por lectura de pesos (k = {k})</translation>
    </message>
    <message>
        <source>Speculation: kept by guess position</source>
        <translation>Especulación: aceptación por posición</translation>
    </message>
    <message>
        <source>kept (%)</source>
        <translation>% aceptado</translation>
    </message>
    <message>
        <source>guess position</source>
        <translation>posición de la propuesta</translation>
    </message>
    <message>
        <source>no speculative step yet</source>
        <translation>aún no hay ningún paso especulativo</translation>
    </message>
    <message>
        <source>guess 1 {first}% · guess {k} {last}% (last {n} steps)</source>
        <translation>1.ª {first}% · {k}.ª {last}% (últimos {n} pasos)</translation>
    </message>
    <message>
        <source>guess 1 {first}% (last {n} steps)</source>
        <translation>1.ª {first}% (últimos {n} pasos)</translation>
    </message>
    <message>
        <source>prefill + decode</source>
        <translation>prefill + decodificación</translation>
    </message>
</context>
<context>
    <name>Replay</name>
    <message>
        <source>recorded {when}</source>
        <translation>grabado el {when}</translation>
    </message>
    <message>
        <source>this is a replay: the settings are the recording&apos;s (the engine is not running)</source>
        <translation>esto es una repetición: los ajustes son los de la grabación (el motor no está en marcha)</translation>
    </message>
    <message>
        <source>membound — REPLAY · {recording}</source>
        <translation>membound — REPETICIÓN · {recording}</translation>
    </message>
    <message>
        <source>&lt;b&gt;REPLAY&lt;/b&gt; of {where} — no engine is running</source>
        <translation>&lt;b&gt;REPETICIÓN&lt;/b&gt; de {where} — no hay ningún motor en marcha</translation>
    </message>
    <message>
        <source>Play  Space</source>
        <translation>Reproducir  Espacio</translation>
    </message>
    <message>
        <source>Pause  Space</source>
        <translation>Pausa  Espacio</translation>
    </message>
</context>
<context>
    <name>Report</name>
    <message>
        <source>membound session report ({date})</source>
        <translation>Informe de la sesión de membound ({date})</translation>
    </message>
    <message>
        <source>From a replay: {file}.</source>
        <translation>De una repetición: {file}.</translation>
    </message>
    <message>
        <source>Model: {model}, {params} M parameters, on {device}</source>
        <translation>Modelo: {model}, {params} M parámetros, en {device}</translation>
    </message>
    <message>
        <source>Hardware: {name} — {source}; peak bandwidth {gbs} GB/s</source>
        <translation>Hardware: {name} — {source}; ancho de banda pico {gbs} GB/s</translation>
    </message>
    <message>
        <source>Steps recorded: {n}</source>
        <translation>Pasos registrados: {n}</translation>
    </message>
    <message>
        <source>Settings timeline</source>
        <translation>Cronología de los ajustes</translation>
    </message>
    <message>
        <source>| step | s | change | settings from here |</source>
        <translation>| paso | s | cambio | ajustes desde aquí |</translation>
    </message>
    <message>
        <source>Decode, per setting (medians over its steps)</source>
        <translation>Decodificación, por configuración (medianas de sus pasos)</translation>
    </message>
    <message>
        <source>| settings | steps | tokens/s | ceiling tokens/s | GB/s | MBU | MFU |</source>
        <translation>| configuración | pasos | tokens/s | techo tokens/s | GB/s | MBU | MFU |</translation>
    </message>
    <message>
        <source>GB/s, MBU and MFU are the cost model&apos;s bytes and FLOPs over the measured step time (engine/metrics.py); the ceiling is peak bandwidth ÷ bytes per token.</source>
        <translation>GB/s, MBU y MFU son los bytes y FLOPs del modelo de coste divididos por el tiempo de paso medido (engine/metrics.py); el techo es el ancho de banda pico ÷ bytes por token.</translation>
    </message>
    <message>
        <source>Plots</source>
        <translation>Gráficas</translation>
    </message>
    <message>
        <source>The window</source>
        <translation>La ventana</translation>
    </message>
</context>
<context>
    <name>SeedTable</name>
    <message>
        <source>What the hardware allows</source>
        <translation>Lo que permite el hardware</translation>
    </message>
    <message>
        <source>the weights&apos; format the table assumes, as the engine stores it (INT4: groups of {group}, an fp16 scale and min a group, the head at INT8)</source>
        <translation>el formato de los pesos que supone la tabla, tal como lo guarda el motor (INT4: grupos de {group}, una escala y un mínimo fp16 por grupo, la cabeza en INT8)</translation>
    </message>
    <message>
        <source>the loaded model: {model}</source>
        <translation>el modelo cargado: {model}</translation>
    </message>
    <message>
        <source>max batch-1 decode tokens/s = bandwidth ÷ weight bytes per token (model); OOM: the weights alone exceed the chip&apos;s memory. Bandwidth: {device}GPUs from datasheets. TP n: n × {gpu}, each reading 1/n of the weights, plus two all-reduces per layer at NVLink bandwidth ({link_gbs} GB/s; latency not counted).</source>
        <translation>tokens/s máximos de decode con lote 1 = ancho de banda ÷ bytes de pesos por token (modelo); OOM: solo los pesos ya superan la memoria del chip. Ancho de banda: {device}GPUs según sus fichas técnicas. TP n: n × {gpu}, cada una lee 1/n de los pesos, más dos all-reduce por capa al ancho de banda de NVLink ({link_gbs} GB/s; sin contar la latencia).</translation>
    </message>
    <message>
        <source>tensor parallelism over {n} {gpu}: {memory_gb} GB together; each GPU reads its 1/{n} of every weight matrix at {gbs} GB/s, and every layer all-reduces its hidden vector twice over NVLink ({link_gbs} GB/s both ways)</source>
        <translation>paralelismo tensorial en {n} {gpu}: {memory_gb} GB entre todas; cada GPU lee su 1/{n} de cada matriz de pesos a {gbs} GB/s, y cada capa hace dos all-reduce de su vector oculto por NVLink ({link_gbs} GB/s en cada sentido)</translation>
    </message>
    <message>
        <source>parameters</source>
        <translation>parámetros</translation>
    </message>
    <message>
        <source>{read_gb} GB read per token; {held_gb} GB of weights held</source>
        <translation>{read_gb} GB leídos por token; {held_gb} GB de pesos en memoria</translation>
    </message>
</context>
<context>
    <name>Serving</name>
    <message>
        <source>continuous batching</source>
        <translation>lotes continuos</translation>
    </message>
    <message>
        <source>static batching</source>
        <translation>lotes estáticos</translation>
    </message>
    <message>
        <source>pre-empted {n}</source>
        <translation>desalojadas {n}</translation>
    </message>
    <message>
        <source>prefix cache {pct}%</source>
        <translation>caché de prefijos {pct} %</translation>
    </message>
    <message>
        <source>tokens/s</source>
        <translation>tokens/s</translation>
    </message>
    <message>
        <source>aggregate (all requests)</source>
        <translation>agregado (todas las peticiones)</translation>
    </message>
    <message>
        <source>per request (median)</source>
        <translation>por petición (mediana)</translation>
    </message>
    <message>
        <source>sequences</source>
        <translation>secuencias</translation>
    </message>
    <message>
        <source>time (s)</source>
        <translation>tiempo (s)</translation>
    </message>
    <message>
        <source>batch (running)</source>
        <translation>lote (en curso)</translation>
    </message>
    <message>
        <source>queue (waiting)</source>
        <translation>cola (esperando)</translation>
    </message>
    <message>
        <source>users</source>
        <translation>usuarios</translation>
    </message>
    <message>
        <source>Serving: simulated users, batched</source>
        <translation>Servicio: usuarios simulados, en lotes</translation>
    </message>
    <message>
        <source>move the Users slider above 0 to serve simulated users beside the chat</source>
        <translation>sube el control Usuarios por encima de 0 para servir usuarios simulados junto al chat</translation>
    </message>
    <message>
        <source>{agg} tok/s aggregate · {per} per request</source>
        <translation>{agg} tok/s agregados · {per} por petición</translation>
    </message>
    <message>
        <source>{policy} batching</source>
        <translation>lotes {policy}</translation>
    </message>
    <message>
        <source>{policy} · batch {running} · queue {waiting}</source>
        <translation>{policy} · lote {running} · cola {waiting}</translation>
    </message>
</context>
<context>
    <name>Talk</name>
    <message>
        <source>Keep decoding  Ctrl+K</source>
        <translation>Seguir decodificando  Ctrl+K</translation>
    </message>
    <message>
        <source>the model keeps talking until stopped (Esc): each reply runs to its token budget, then a follow-up; when the context fills, a new chat starts</source>
        <translation>el modelo sigue hablando hasta que se le detiene (Esc): cada respuesta agota su presupuesto de tokens y sigue otra pregunta; cuando el contexto se llena, empieza un chat nuevo</translation>
    </message>
    <message>
        <source>Export…  Ctrl+E</source>
        <translation>Exportar…  Ctrl+E</translation>
    </message>
    <message>
        <source>the window and each plot as PNG and SVG, the steps as CSV, a one-page report</source>
        <translation>la ventana y cada gráfica en PNG y SVG, los pasos en CSV, un informe de una página</translation>
    </message>
    <message>
        <source>tour step {number} left out: on this machine {why}</source>
        <translation>paso {number} del recorrido omitido: en esta máquina {why}</translation>
    </message>
    <message>
        <source>Export the session into a folder</source>
        <translation>Exportar la sesión a una carpeta</translation>
    </message>
    <message>
        <source>export failed: {error}</source>
        <translation>la exportación falló: {error}</translation>
    </message>
    <message>
        <source>exported {n} files to {folder} (report.md, steps.csv, PNG and SVG)</source>
        <translation>{n} archivos exportados a {folder} (report.md, steps.csv, PNG y SVG)</translation>
    </message>
</context>
<context>
    <name>Tour</name>
    <message>
        <source>step {number} needs the setting {setting}, which this engine does not have</source>
        <translation>el paso {number} necesita el ajuste {setting}, que este motor no tiene</translation>
    </message>
    <message>
        <source>tour step {number} ({title}) will be refused here: {why}</source>
        <translation>el paso {number} del recorrido ({title}) se rechazará aquí: {why}</translation>
    </message>
    <message>
        <source>tour: {what}: left out</source>
        <translation>recorrido: {what}: omitido</translation>
    </message>
</context>
<context>
    <name>Window</name>
    <message>
        <source>TTFT {ms} ms</source>
        <translation>TTFT {ms} ms</translation>
    </message>
    <message>
        <source>TTFT {ms} ms ({cached} of {prompt} prompt tokens cached)</source>
        <translation>TTFT {ms} ms ({cached} de {prompt} tokens del prompt en caché)</translation>
    </message>
    <message>
        <source>speculation: {pct}% of guesses kept ({per_step} a step), {tokens} tokens per weight read</source>
        <translation>especulación: {pct}% de las propuestas aceptadas ({per_step} por paso), {tokens} tokens por lectura de pesos</translation>
    </message>
    <message>
        <source>finished</source>
        <translation>terminada</translation>
    </message>
    <message>
        <source>hit max tokens</source>
        <translation>llegó al máximo de tokens</translation>
    </message>
    <message>
        <source>stopped</source>
        <translation>detenida</translation>
    </message>
    <message>
        <source>context window full</source>
        <translation>ventana de contexto llena</translation>
    </message>
    <message>
        <source>membound — watch decoding hit the memory wall</source>
        <translation>membound — mira cómo el decode choca con el muro de la memoria</translation>
    </message>
    <message>
        <source>Model…  Ctrl+O</source>
        <translation>Modelo…  Ctrl+O</translation>
    </message>
    <message>
        <source>Light theme  F9</source>
        <translation>Tema claro  F9</translation>
    </message>
    <message>
        <source>Large fonts  F10</source>
        <translation>Letra grande  F10</translation>
    </message>
    <message>
        <source>Hardware table  F8</source>
        <translation>Tabla de hardware  F8</translation>
    </message>
    <message>
        <source>What the hardware allows</source>
        <translation>Lo que permite el hardware</translation>
    </message>
    <message>
        <source>KV cache</source>
        <translation>Caché KV</translation>
    </message>
    <message>
        <source>Serving</source>
        <translation>Servicio</translation>
    </message>
    <message>
        <source>Dismiss</source>
        <translation>Cerrar</translation>
    </message>
    <message>
        <source>starting…</source>
        <translation>arrancando…</translation>
    </message>
    <message>
        <source>restarting the engine…</source>
        <translation>reiniciando el motor…</translation>
    </message>
    <message>
        <source>new chat</source>
        <translation>chat nuevo</translation>
    </message>
    <message>
        <source>{model} · {size} parameters · {device}</source>
        <translation>{model} · {size} parámetros · {device}</translation>
    </message>
    <message>
        <source>not applied: {reason}</source>
        <translation>no aplicado: {reason}</translation>
    </message>
    <message>
        <source>no model path given</source>
        <translation>no se ha indicado la ruta del modelo</translation>
    </message>
    <message>
        <source>Dark theme  F9</source>
        <translation>Tema oscuro  F9</translation>
    </message>
    <message>
        <source>the engine is back: {model}, {turns} turns of the conversation kept</source>
        <translation>el motor ha vuelto: {model}, se conservan {turns} turnos de la conversación</translation>
    </message>
    <message>
        <source>engine restarted</source>
        <translation>motor reiniciado</translation>
    </message>
    <message>
        <source>loaded {model}</source>
        <translation>cargado {model}</translation>
    </message>
    <message>
        <source>start: {settings}</source>
        <translation>inicio: {settings}</translation>
    </message>
    <message>
        <source>above the measured roof: the cost model or the probe is wrong (step {step}, {phase}: MBU {mbu}%, MFU {mfu}%)</source>
        <translation>por encima del techo medido: el modelo de costes o la sonda se equivocan (paso {step}, {phase}: MBU {mbu}%, MFU {mfu}%)</translation>
    </message>
    <message>
        <source>{n} tokens, {how}</source>
        <translation>{n} tokens, {how}</translation>
    </message>
    <message>
        <source>decode {tps} tok/s (this reply, batched)</source>
        <translation>decodificación {tps} tok/s (esta respuesta, en lote)</translation>
    </message>
    <message>
        <source>decode {tps} tok/s</source>
        <translation>decodificación {tps} tok/s</translation>
    </message>
    <message>
        <source>{gbs} GB/s (model) = {pct}% of {peak} GB/s peak</source>
        <translation>{gbs} GB/s (modelo) = {pct}% del pico de {peak} GB/s</translation>
    </message>
    <message>
        <source>interrupted: {message}</source>
        <translation>interrumpida: {message}</translation>
    </message>
    <message>
        <source>the model</source>
        <translation>el modelo</translation>
    </message>
    <message>
        <source>{message} — the conversation is kept; your next message or setting starts it again with {model} and the same settings</source>
        <translation>{message} — la conversación se conserva; tu próximo mensaje o ajuste la reanuda con {model} y los mismos ajustes</translation>
    </message>
    <message>
        <source>serving the simulated users failed, so they are off: {message}</source>
        <translation>falló el servicio a los usuarios simulados, así que se han desactivado: {message}</translation>
    </message>
    <message>
        <source>could not load the model: {message}</source>
        <translation>no se pudo cargar el modelo: {message}</translation>
    </message>
    <message>
        <source>(still using {model})</source>
        <translation>(se sigue usando {model})</translation>
    </message>
    <message>
        <source>the reply failed: {message}</source>
        <translation>la respuesta falló: {message}</translation>
    </message>
    <message>
        <source>the conversation so far is kept</source>
        <translation>se conserva la conversación hasta aquí</translation>
    </message>
    <message>
        <source>new chat failed: {message}</source>
        <translation>falló el chat nuevo: {message}</translation>
    </message>
    <message>
        <source>measuring quality failed: {message}</source>
        <translation>falló la medición de la calidad: {message}</translation>
    </message>
</context>
</TS>

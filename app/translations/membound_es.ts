<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE TS>
<TS version="2.1" language="es" sourcelanguage="en">
<context>
    <name>Attach</name>
    <message>
        <source>Attach to a server</source>
        <translation>Conectar a un servidor</translation>
    </message>
    <message>
        <source>Attach to server…</source>
        <translation>Conectar a servidor…</translation>
    </message>
    <message>
        <source>Detach</source>
        <translation>Desconectar</translation>
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
        <translation>los pesos del modelo borrador (el propio modelo, cuantizado: menos bytes por apuesta)</translation>
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
</context>
<context>
    <name>ModelPicker</name>
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
        <source>Browse…</source>
        <translation>Examinar…</translation>
    </message>
</context>
<context>
    <name>Plots</name>
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
        <translation>% de los FLOP/s pico</translation>
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
        <translation>tiempo por paso (ms)</translation>
    </message>
    <message>
        <source>time since send (s)</source>
        <translation>tiempo desde el envío (s)</translation>
    </message>
    <message>
        <source>{ms} ms/token (median)</source>
        <translation>{ms} ms/token (mediana)</translation>
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
        <source>ceiling {tps} (model)</source>
        <translation>techo {tps} (modelo)</translation>
    </message>
</context>
<context>
    <name>Replay</name>
    <message>
        <source>recorded {when}</source>
        <translation>grabado el {when}</translation>
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
    <name>SeedTable</name>
    <message>
        <source>What the hardware allows</source>
        <translation>Lo que permite el hardware</translation>
    </message>
    <message>
        <source>{name} weights</source>
        <translation>pesos {name}</translation>
    </message>
    <message>
        <source>bytes per weight the table assumes (INT4: group of 128, fp16 scale)</source>
        <translation>bytes por peso que supone la tabla (INT4: grupo de 128, escala fp16)</translation>
    </message>
    <message>
        <source>max batch-1 decode tokens/s = bandwidth ÷ weight bytes per token (model); OOM: the weights alone exceed the chip&apos;s memory. Bandwidth: {device}GPUs from datasheets. TP n: n × {gpu}, each reading 1/n of the weights, plus two all-reduces per layer at NVLink bandwidth ({link_gbs} GB/s; latency not counted).</source>
        <translation>tokens/s máximos de decode con lote 1 = ancho de banda ÷ bytes de pesos por token (modelo); OOM: solo los pesos ya superan la memoria del chip. Ancho de banda: {device}GPUs según sus fichas técnicas. TP n: n × {gpu}, cada una lee 1/n de los pesos, más dos all-reduce por capa al ancho de banda de NVLink ({link_gbs} GB/s; sin contar la latencia).</translation>
    </message>
</context>
<context>
    <name>Serving</name>
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
        <source>new chat</source>
        <translation>chat nuevo</translation>
    </message>
    <message>
        <source>not applied: {reason}</source>
        <translation>no aplicado: {reason}</translation>
    </message>
    <message>
        <source>Dark theme  F9</source>
        <translation>Tema oscuro  F9</translation>
    </message>
    <message>
        <source>loaded {model}</source>
        <translation>cargado {model}</translation>
    </message>
    <message>
        <source>{n} tokens, {how}</source>
        <translation>{n} tokens, {how}</translation>
    </message>
</context>
</TS>

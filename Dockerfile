# The writ image: owners (`node consumers/owner-main.ts`) and the demo records server.
FROM node:24-slim
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund
COPY src ./src
COPY consumers ./consumers
COPY producers ./producers
COPY examples ./examples
COPY schemas ./schemas
USER node
CMD ["node", "consumers/owner-main.ts"]
